"""Measuring: the load generators (wrk, `lt`), the Runner that times servers and keeps every result.

Runner.measure runs wrk once against a server and records its CPU per
request from /proc; Runner.interleaved alternates subject and reference
round by round (and keeps each label's summary, so a later scenario can
cite an earlier figure); Runner.row adds a line to the summary table that
report.py writes, optionally with the floor the subject is read against.
summarize, ratio_of and met_if turn rounds into the table's medians,
ratios and verdicts.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import time

from . import shared
from .shared import HERE, LUA, cpu_seconds


WRK_RUNS = [0]


def generate(port, seconds, settings, env):
    """One closed-loop measurement: wrk, or `lt webhook` when env names it (LT_GENERATOR=webhook)."""
    if env.get("LT_GENERATOR") == "webhook":
        return lt_webhook(port, seconds, settings, env)
    return wrk(port, seconds, settings, env)


def lt_webhook(port, seconds, settings, env):
    """`lt webhook` (W1): Stripe-signed deliveries, each signed as it is sent; wrk's figures."""
    argv = ["webhook", "--target", f"127.0.0.1:{port}", "--path", env["LT_PATH"], "--duration-ms",
            str(seconds * 1000), "--connections", str(settings.connections), "--threads", str(settings.threads),
            "--secret", env["LT_SECRET"], "--body-bytes", env.get("LT_BODY_BYTES", "2048"),
            "--keys", env.get("LT_KEYS", "unique"), "--space", env.get("LT_SPACE", "100")]
    prefix = env.get("LT_PREFIX", "w1")
    if env.get("LT_KEYS", "unique") == "unique":
        WRK_RUNS[0] += 1  # new event ids per run, as wrk's unique keys
        prefix = f"{prefix}-{WRK_RUNS[0]}"
    raw = lt([*argv, "--prefix", prefix], seconds + 60, settings.pin and settings.pin_generator)
    raw["rps"] = raw["requests"] / (raw["duration_us"] / 1e6)
    raw["errors"] = sum(raw[k] for k in ("connect_errors", "read_errors", "write_errors", "timeouts"))
    return raw


def wrk(port, seconds, settings, env):
    # A fresh key prefix per invocation: keys left in flight by the previous
    # run (a warm-up, say) must not turn into 409s or replays here.
    if env.get("LT_KEYS") == "unique":
        WRK_RUNS[0] += 1
        env = {**env, "LT_PREFIX": f"{env.get('LT_PREFIX', 'lt')}-{WRK_RUNS[0]}"}
    argv = ["wrk", "-t", str(settings.threads), "-c", str(settings.connections), "-d", f"{seconds}s",
            "--timeout", "5s", "-s", str(LUA), f"http://127.0.0.1:{port}/v1/charges"]
    if settings.pin:
        argv = ["taskset", "-c", settings.pin_generator, *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, env={**os.environ, **env})
    line = next((l for l in out.stdout.splitlines() if l.startswith("LTJSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    raw = json.loads(line[len("LTJSON "):])
    raw["rps"] = raw["requests"] / (raw["duration_us"] / 1e6)
    raw["errors"] = sum(raw[k] for k in ("connect_errors", "read_errors", "write_errors", "timeouts"))
    return raw


class Runner:
    def __init__(self, args, stack):
        self.args = args
        self.stack = stack
        self.raw = []     # every measurement, in order
        self.rows = []    # the summary table
        self.notes = []   # one line per outbox scenario, under the raw table
        self.summaries = {}  # (scenario, label) → summary, from interleaved

    def cpu(self):
        return {name: cpu_seconds(pid) for name, pid in self.stack.pids.items()}

    def measure(self, scenario, label, port, env, seconds=None, connections=None):
        seconds = seconds or self.args.duration
        settings = self.args if not connections else argparse.Namespace(**{**vars(self.args),
                                                                            "connections": connections})
        if self.args.warmup > 0:
            generate(port, self.args.warmup, settings, env)
        server = next(name for name, p in self.stack.ports.items() if p == port)
        perf = self.start_perf(scenario, server, label)
        before = self.cpu()
        result = generate(port, seconds, settings, env)
        after = self.cpu()
        if perf:
            self.finish_perf(*perf)
        # CPU per request of each server: steadier than req/s on a shared machine.
        cpu_us = {name: round((after[name] - before[name]) * 1e6 / max(1, result["requests"]), 1) for name in after}
        result.update(scenario=scenario, target=label, server=server, load=os.getloadavg()[0], cpu_us_per_req=cpu_us)
        self.raw.append(result)
        flag = "" if result["errors"] + result["status_errors"] == 0 else \
            f"  [{result['errors']} socket errors, {result['status_errors']} non-2xx/3xx]"
        others = ", ".join(f"{n} {v:.0f}" for n, v in cpu_us.items() if n != server and v >= 1)
        print(f"   {scenario} {label:<28} {result['rps']:>9.0f} req/s  p50 {result['p50_us'] / 1000:6.2f} ms"
              f"  p99 {result['p99_us'] / 1000:6.2f} ms  cpu µs/req {cpu_us[server]:.0f}"
              f"{f' (+ {others})' if others else ''}{flag}", flush=True)
        return result

    def start_perf(self, scenario, server, label):
        """With --profile: samples the gateway under test with perf (cpu-clock, DWARF call graphs)."""
        if not self.args.profile or not server.startswith("gw-") or not shutil.which("perf"):
            return None
        server = f"{server}-{'guarded' if 'guarded' in label or 'replays' in label else 'passthrough'}"
        data = HERE / "results" / f"perf-{scenario}-{server}.data"
        pid = self.stack.pids[server.rsplit("-", 1)[0]]
        proc = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "499", "--call-graph",
                                 "dwarf,16384", "-p", str(pid), "-o", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        return proc, data, scenario, server

    def finish_perf(self, proc, data, scenario, server):
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        out = HERE / "results" / f"profile-{scenario}-{server}.txt"
        reports = []
        for title, flags in (("self time by symbol", ["--no-children"]),
                             ("inclusive time by symbol", ["--children"])):
            text = subprocess.run(["perf", "report", "-i", str(data), *flags, "--sort", "symbol", "--stdio",
                                   "-g", "none", "--percent-limit", "0.7"], capture_output=True, text=True,
                                  timeout=600).stdout
            rows = [" ".join(l.split()).removesuffix(" - -") for l in text.splitlines() if l and not l.startswith("#")]
            reports.append(f"## {title}\n\n" + "\n".join(rows))
        out.write_text(f"# perf profile: {scenario} on {server}\n\n" + "\n\n".join(reports) + "\n")
        print(f"   profile: {out}", flush=True)

    def interleaved(self, scenario, targets, connections=None):
        """targets: [(label, port, env)]; alternates their order each round. connections overrides wrk's -c."""
        results = {label: [] for label, _, _ in targets}
        for round_ in range(self.args.rounds):
            order = targets if round_ % 2 == 0 else list(reversed(targets))
            for label, port, env in order:
                results[label].append(self.measure(scenario, label, port, env, connections=connections))
        summaries = {label: summarize(rs) for label, rs in results.items()}
        self.summaries.update({(scenario, label): summary for label, summary in summaries.items()})
        return summaries

    def row(self, scenario, what, measured, reference=None, ratio=None, target="", met=None, note="", floor=None):
        """floor: (name, summary) of the floor measured in the same rounds, for the table's × floor column."""
        self.rows.append(dict(scenario=scenario, what=what, measured=measured, reference=reference, ratio=ratio,
                              target=target, met=met, note=note, floor=floor))


def summarize(results):
    med = lambda k: statistics.median(r[k] for r in results)
    summary = {"rps": med("rps"), "p50_us": med("p50_us"), "p99_us": med("p99_us"),
               "errors": sum(r["errors"] + r["status_errors"] for r in results), "rounds": len(results)}
    if all("cpu_us_per_req" in r for r in results):
        summary["cpu_us"] = statistics.median(r["cpu_us_per_req"][r["server"]] for r in results)
    return summary


def ratio_of(sub, ref):
    return sub["rps"] / ref["rps"] if ref and ref["rps"] else None


def met_if(sub, ref, factor):
    return None if not ref else sub["rps"] >= factor * ref["rps"]


def lt(argv, timeout, cpus=None):
    argv = [str(shared.LT), *argv]
    if cpus:
        argv = ["taskset", "-c", cpus, *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])
