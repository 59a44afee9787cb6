"""Setup: installing wrk and nginx, building the binaries, and starting the gateway scenarios' servers.

Stack holds the servers of one run (the static upstream, the nginx proxy,
the floors, Redis and the gateways) with their ports and pids; nginx_conf
and gateway_conf write their configuration files into the run's workdir.
With --runtimes, each gateway runs once per runtime (gateway_name).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import shared
from .shared import HERE, NONCE, ROOT, TARGET, TOOLS_TARGET, free_port, say


def ensure_tools(args):
    missing = [p for p in ("wrk", "nginx") if not shutil.which(p) and not Path(f"/usr/sbin/{p}").exists()]
    if missing and not args.no_install:
        say(f"installing {' '.join(missing)} from Debian's packages")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=False, env=env,
                       stdout=subprocess.DEVNULL)
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed and could not be installed (apt-get install wrk)")
    return nginx


def use_profile(profile):
    """Points the binaries at <target>/<profile>/ (release, or debug with --debug); <target> is shared.TARGET."""
    shared.LT = TOOLS_TARGET / profile / "lt"
    shared.GATEWAY = TARGET / profile / "idemgate"
    shared.OUTBOX_BENCH = TARGET / profile / "examples" / "outbox-bench"


def build(args):
    if args.no_build:
        return
    release = [] if args.debug else ["--release"]
    say(f"cargo build {' '.join(release) or '(debug)'} (idemgate, its outbox-bench example and load-tests/tools)")
    subprocess.run(["cargo", "build", *release, "--quiet"], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", *release, "--quiet", "--example", "outbox-bench"], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", *release, "--quiet", "--manifest-path", str(HERE / "tools" / "Cargo.toml"),
                    "--target-dir", str(TOOLS_TARGET)], cwd=ROOT, check=True)


def nginx_conf(workdir, name, body, workers=2, access_log=False):
    conf = workdir / f"{name}.conf"
    temp = workdir / f"{name}-temp"
    temp.mkdir(exist_ok=True)
    conf.write_text(f"""
daemon off;
worker_processes {workers};
pid {workdir}/{name}.pid;
error_log {workdir}/{name}-error.log warn;
events {{ worker_connections 8192; }}
http {{
  {f"access_log {workdir}/{name}-access.log;" if access_log else "access_log off;"}
  default_type text/plain;
  keepalive_requests 1000000;
  client_body_temp_path {temp}/body;
  proxy_temp_path {temp}/proxy;
  {body}
}}
""")
    return conf


def gateway_conf(workdir, name, port, store, upstream_port, request_log=False, runtime=None, routes=None):
    """routes: the [[routes]] tables (UPSTREAM for the upstream's URL); default one guarded route "/"."""
    conf = workdir / f"{name}.toml"
    # "info" is the default: one line per request, like nginx's access log;
    # "warn" has no per-request line, like nginx with access_log off.
    level = "info" if request_log else "warn"
    # Without --runtimes the field is not written: the binary's default runs
    # (and a binary that predates the field still starts).
    runtime_line = f'runtime = "{runtime}"\n' if runtime else ""
    conf.write_text(f"""
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{free_port()}"
store = "{store}"
{runtime_line}
[log]
level = "{level}"

[gateway]
key_ttl = "10m"

{(routes or DEFAULT_ROUTE).replace("UPSTREAM", f"http://127.0.0.1:{upstream_port}")}
""")
    return conf


DEFAULT_ROUTE = """
[[routes]]
name = "bench"
prefix = "/"
upstream = "UPSTREAM"
methods = ["POST"]
"""


def gateway_name(base, runtime):
    """The server name of one gateway for one runtime: `gw-memory`, or `gw-memory@per-core` with --runtimes."""
    return f"{base}@{runtime}" if runtime else base


class Stack:
    """The servers of one run: static upstream, nginx proxy, floors, Redis, gateways.

    runtimes is [None] (the binary's default, no `runtime` field written) or
    the --runtimes list; the throughput gateways run once per entry.
    """

    def __init__(self, procs, nginx, workdir, runtimes=(None,)):
        self.procs, self.nginx, self.workdir = procs, nginx, workdir
        self.runtimes = list(runtimes)
        self.ports = {}
        self.pids = {}

    def start_nginx(self, name, body, access_log=False):
        port = free_port()
        conf = nginx_conf(self.workdir, name, body.replace("PORT", str(port)), access_log=access_log)
        proc = self.procs.start(name, [self.nginx, "-p", str(self.workdir), "-c", str(conf)], port)
        self.ports[name], self.pids[name] = port, proc.pid
        return port

    def start_redis(self):
        if shutil.which("redis-server"):
            port = free_port()
            proc = self.procs.start("redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                              "--save", "", "--appendonly", "no"], port)
            self.pids["redis"] = proc.pid
            return f"redis://127.0.0.1:{port}/0"
        say("redis-server not found: using the shared Redis on 127.0.0.1:6379 with a run-unique prefix")
        return f"redis://127.0.0.1:6379/0?prefix=idemgate-lt-{NONCE}:"

    def start_gateway(self, name, store, upstream_port, request_log=False, runtime=None, routes=None):
        port = free_port()
        conf = gateway_conf(self.workdir, name, port, store, upstream_port, request_log, runtime, routes)
        proc = self.procs.start(name, [str(shared.GATEWAY), "serve", "--config", str(conf)], port)
        self.ports[name], self.pids[name] = port, proc.pid
        return port

    def start_floor(self, name, command, runtime, upstream_port=None):
        """`lt floor-proxy` (to upstream_port) or `lt floor-answer`, one thread per core; an hour at most."""
        port = free_port()
        argv = [str(shared.LT), command, "--listen", f"127.0.0.1:{port}", "--runtime", runtime,
                "--lifetime-ms", "3600000"]
        if upstream_port:
            argv += ["--upstream", f"127.0.0.1:{upstream_port}"]
        proc = self.procs.start(name, argv, port)
        self.ports[name], self.pids[name] = port, proc.pid
        return port
