"""The outbox scenarios' plumbing: PostgreSQL schemas, `lt sink` destinations, relays, and outbox-bench.

Outbox migrates a schema per scenario (`lt_<pid>_<time>_<tag>`) and drops
them all at the end, and those of runs that died; it starts sinks and
`idemgate relay` with every [relay] knob at its default. sink_get,
wait_until, bench and pct are the scenarios' small helpers.
"""

import json
import os
import subprocess
import time
from pathlib import Path

from . import shared
from .shared import free_port


# Plaintext by default, like the relay figures measured before TLS support:
# the relay's own cost is what P7-P9 measure, not the loopback TLS.
DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
NATS_URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
DESTINATION = "bench"
SLOW_DESTINATION = "slow"


class Outbox:
    """The outbox scenarios' Postgres side: a schema per scenario, all dropped at the end."""

    def __init__(self, procs, workdir):
        self.procs, self.workdir = procs, workdir
        self.schemas = []
        host = DATABASE_URL.split("@")[-1].split("/")[0].rsplit(":", 1)[0]
        if host not in ("127.0.0.1", "localhost", "[::1]"):
            raise RuntimeError(f"DATABASE_URL must point at 127.0.0.1, not {host}")

    def psql(self, sql, timeout=300):
        out = subprocess.run(["psql", DATABASE_URL, "-v", "ON_ERROR_STOP=1", "-Atqc", sql], capture_output=True,
                             text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"psql failed: {out.stderr.strip()}")
        return out.stdout.strip()

    def timed(self, sql, timeout=300):
        started = time.monotonic()
        out = self.psql(sql, timeout)
        return out, time.monotonic() - started

    def drop_orphans(self):
        """Schemas of harness runs that died before dropping them: their pid is gone."""
        names = self.psql(r"SELECT nspname FROM pg_namespace WHERE nspname ~ '^lt_[0-9]+_[0-9]+_[a-z0-9]+$'")
        for name in names.split():
            if not Path(f"/proc/{name.split('_')[1]}").exists():
                self.psql(f"DROP SCHEMA IF EXISTS {name} CASCADE")

    def new_schema_name(self, tag):
        """A fresh schema name `lt_<pid>_<time>_<tag>` (it carries the pid, see drop_orphans), dropped at the end."""
        name = f"lt_{os.getpid()}_{int(time.time())}_{tag}"
        self.schemas.append(name)
        return name

    def drop_schema(self, name):
        """Drops one of this run's schemas now instead of at the end."""
        self.psql(f"DROP SCHEMA {name} CASCADE", timeout=120)
        self.schemas.remove(name)

    def schema(self, tag):
        """A fresh schema migrated by idemgate (see new_schema_name)."""
        name = self.new_schema_name(tag)
        out = subprocess.run([str(shared.GATEWAY), "migrate", "--database-url", DATABASE_URL], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "IDEMGATE__RELAY__SCHEMA": name})
        if out.returncode != 0:
            raise RuntimeError(f"idemgate migrate ({name}) failed: {out.stderr.strip()}")
        return name

    def drop_all(self):
        for name in self.schemas:
            try:
                self.psql(f"DROP SCHEMA IF EXISTS {name} CASCADE", timeout=120)
            except Exception as e:  # noqa: BLE001 - report and go on dropping the others
                print(f"   warning: schema {name} not dropped: {e}", flush=True)
        self.schemas = []

    def start_sink(self, name, delay_ms=0):
        port = free_port()
        proc = self.procs.start(name, [str(shared.LT), "sink", "--listen", f"127.0.0.1:{port}", "--lifetime-ms",
                                       "1800000", "--delay-ms", str(delay_ms)], port)
        return port, proc

    def start_relay(self, name, schema, sink_port, slow_port=None):
        """The relay to `lt sink` at sink_port (and a slow destination at slow_port)."""
        destinations = f"""
[destinations.{DESTINATION}]
url = "http://127.0.0.1:{sink_port}/deliver"
""" + ("" if slow_port is None else f"""
[destinations.{SLOW_DESTINATION}]
url = "http://127.0.0.1:{slow_port}/deliver"
timeout = "10s"
""")
        return self._relay(name, schema, destinations)

    def start_broker_relay(self, name, schema, kind, url, broker):
        """The relay to one broker destination: a NATS stream's `broker.>` subjects or a RabbitMQ exchange."""
        target = (f'subject = "{broker}.{{operation}}"' if kind == "nats"
                  else f'exchange = "{broker}"\nrouting_key = "{{operation}}"')
        return self._relay(name, schema, f"""
[destinations.{DESTINATION}]
kind = "{kind}"
url = "{url}"
{target}
""")

    def _relay(self, name, schema, destinations):
        """`idemgate relay` as shipped (every [relay] knob at its default) with `destinations`."""
        admin = free_port()
        conf = self.workdir / f"{name}.toml"
        conf.write_text(f"""
admin_listen = "127.0.0.1:{admin}"

[log]
level = "warn"

[relay]
database_url = "{DATABASE_URL}"
schema = "{schema}"
""" + destinations)
        return self.procs.start(name, [str(shared.GATEWAY), "relay", "--config", str(conf)], admin)

    def delivery_rate(self, schema):
        """Rows delivered per second from the first delivery recorded to the last, as the database saw them."""
        out = self.psql(f"SELECT count(*), extract(epoch FROM max(delivered_at) - min(delivered_at)) "
                        f"FROM {schema}.delivered")
        rows, span = out.split("|")
        return int(rows) / max(1e-6, float(span or 0))

    def count(self, schema):
        return int(self.psql(f"SELECT count(*) FROM {schema}.outbox"))


def sink_get(port, path):
    out = subprocess.run(["curl", "-s", "--max-time", "30", f"http://127.0.0.1:{port}{path}"], capture_output=True,
                         text=True, timeout=40)
    if out.returncode != 0:
        raise RuntimeError(f"sink {path}: curl exited {out.returncode}")
    return out.stdout


def wait_until(check, seconds, step=0.1):
    """Polls check() until it returns true, at most `seconds`; returns its last value."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(step)


def bench(argv, timeout):
    out = subprocess.run([str(shared.OUTBOX_BENCH), *argv], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"outbox-bench {argv[0]} failed: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def pct(samples, q):
    if not samples:
        return 0
    return samples[min(len(samples), max(1, int(-(-q * len(samples) // 1)))) - 1]
