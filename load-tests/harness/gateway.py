"""The gateway's scenarios, P1–P6, P10, P11, T1 and W1 (PERFORMANCE.md), against one set of servers.

gateway_scenarios starts the servers once for all of them (the upstream,
nginx, the floors, Redis and the gateways, once per --runtimes entry) and
returns P5's verdict, the one result that fails a run. The throughput
scenarios (P1–P4, P11, T1) are in throughput.py; here are P5 correctness
(`lt burst` on one key, memory and Redis), P6 latency at a fixed rate
(`lt rate`), P10 memory at 1,000 connections (`lt hold`, then wrk), and D1,
the cost of `?wait_replicas=1` (first requests on Redis with a replica,
N = 1 against N = 0: a measurement, no target).
"""

import argparse
import json
import os
import subprocess
import time

from . import shared
from .shared import NONCE, free_port, rss_kib, say
from .measuring import lt, ratio_of, summarize, wrk
from .setup import gateway_name
from .throughput import labelled, throughput
from .webhooks import w1


def gateway_scenarios(runner, stack, procs, nginx, wanted, workdir):
    """P1–P6, P10 and P11: the gateway's servers, started once for all of them. Returns P5's verdict."""
    correct = True
    say(f"starting servers (logs in {workdir})")
    if nginx:
        up = stack.start_nginx("upstream", 'server { listen 127.0.0.1:PORT; location / { return 200 "ok"; } }')
    else:
        up = free_port()
        stack.pids["upstream"] = procs.start("upstream", [str(shared.LT), "upstream", "--listen", f"127.0.0.1:{up}",
                                                          "--count", "0", "--lifetime-ms", "3600000"], up).pid
        stack.ports["upstream"] = up
    if nginx:
        proxy = f"""
  upstream backend {{ server 127.0.0.1:{up}; keepalive 64; keepalive_requests 1000000; }}
  server {{ listen 127.0.0.1:PORT; location / {{
    proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }} }}"""
        stack.start_nginx("nginx-proxy", proxy)
        if wanted("P1") or wanted("P11"):
            # P1 and P11 with logs: nginx's access log and idemgate's default request log, each to a file.
            stack.start_nginx("nginx-proxy-logged", proxy, access_log=True)
    if any(wanted(s) for s in ("P1", "P4", "P11", "T1")):
        # The floors (lt's own): the minimal hyper proxy per core and work-stealing, and the replay floor.
        stack.start_floor("floor-proxy", "floor-proxy", "per-core", up)
        stack.start_floor("floor-proxy-ws", "floor-proxy", "work-stealing", up)
        stack.start_floor("floor-answer", "floor-answer", "per-core")
    stack.redis_url = stack.start_redis()
    for runtime in stack.runtimes:
        stack.start_gateway(gateway_name("gw-memory", runtime), "memory://?max_entries=10000000&max_bytes=2GiB", up,
                            runtime=runtime)
        stack.start_gateway(gateway_name("gw-redis", runtime), stack.redis_url, up, runtime=runtime)
        if wanted("P1") or wanted("P11"):
            stack.start_gateway(gateway_name("gw-logged", runtime), "memory://", up, request_log=True,
                                runtime=runtime)
    if any(wanted(s) for s in ("P1", "P2", "P3", "P4", "P11", "T1")):
        throughput(runner, stack, bool(nginx), wanted)
    if wanted("P5"):
        correct = correctness(runner, stack, procs)
    if wanted("P6"):
        fixed_rate(runner, stack, bool(nginx))
    if wanted("P10"):
        memory_at_connections(runner, stack, procs)
    if wanted("D1"):
        durability_cost(runner, stack, procs, up)
    if wanted("W1"):
        w1(runner, stack, up)
    # Idle, but they hold ports and memory: stopped before the outbox scenarios run.
    procs.stop_all()
    return correct


def durability_cost(runner, stack, procs, up):
    """D1: first requests on Redis with one replica attached, wait_replicas=1 against 0, interleaved."""
    if "redis" not in stack.pids:
        runner.row("D1", "unique keys, Redis + replica, wait_replicas=1 vs 0", None,
                   note="skipped: needs a private redis-server (and a replica of it)")
        return
    primary = stack.redis_url.split("127.0.0.1:")[1].split("/")[0]
    # The scenarios before leave millions of keys in the harness's own Redis;
    # D1 measures first requests only, and a replica's full sync of all that
    # would outlast any sensible wait.
    subprocess.run(["redis-cli", "-p", primary, "FLUSHALL"], capture_output=True, timeout=60, check=True)
    port = free_port()
    replica = procs.start("redis-replica", ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                            "--appendonly", "no", "--replicaof", "127.0.0.1", primary], port)
    stack.pids["redis-replica"] = replica.pid
    for _ in range(600):  # in sync before measuring (30 s at most): until then every begin would be refused
        info = subprocess.run(["redis-cli", "-p", str(port), "INFO", "replication"], capture_output=True, text=True,
                              timeout=10).stdout
        if "master_link_status:up" in info:
            break
        time.sleep(0.05)
    else:
        raise RuntimeError("the D1 replica did not sync with the primary")
    runtime = stack.runtimes[0]  # with --runtimes, D1 measures the first one
    gw_wait = stack.start_gateway("gw-redis-wait", f"{stack.redis_url}?wait_replicas=1", up, runtime=runtime)
    say("D1 first requests, unique keys, Redis with one replica: wait_replicas=1 against wait_replicas=0")
    unique = {"LT_METHOD": "POST", "LT_KEYS": "unique"}
    r = runner.interleaved("D1", [("guarded POST, Redis, N = 0", stack.ports[gateway_name("gw-redis", runtime)],
                                   {**unique, "LT_PREFIX": f"d1a-{NONCE}"}),
                                  ("guarded POST, Redis, N = 1", gw_wait, {**unique, "LT_PREFIX": f"d1b-{NONCE}"})])
    sub, ref = r["guarded POST, Redis, N = 1"], r["guarded POST, Redis, N = 0"]
    runner.row("D1", "unique keys, Redis + replica, wait_replicas=1", sub, ("wait_replicas=0", ref),
               ratio_of(sub, ref), "measured (no target)", None)


def fixed_rate(runner, stack, has_nginx):
    rate = 2000
    seconds = runner.args.duration
    say(f"P6 added latency at a fixed {rate} req/s, unique keys, Redis store ({seconds}s per measurement)")
    if not has_nginx:
        runner.row("P6", f"p99 at {rate} req/s, Redis", None, note="skipped: nginx is not installed (reference)")
        return
    targets = [("nginx proxy POST", stack.ports["nginx-proxy"])]
    targets += [(labelled("guarded POST, Redis", runtime), stack.ports[gateway_name("gw-redis", runtime)])
                for runtime in stack.runtimes]
    results = {label: [] for label, _ in targets}
    for round_ in range(runner.args.rounds):
        for label, port in (targets if round_ % 2 == 0 else list(reversed(targets))):
            argv = ["rate", "--target", f"127.0.0.1:{port}", "--rate", str(rate), "--duration-ms",
                    str(int(seconds * 1000)), "--warmup-ms", str(int(runner.args.warmup * 1000)), "--connections",
                    "64", "--keys", "unique", "--prefix", f"p6-{round_}-{port}-{NONCE}"]
            before = runner.cpu()
            r = lt(argv, seconds + 60, runner.args.pin and runner.args.pin_generator)
            after = runner.cpu()
            server = next(name for name, p in stack.ports.items() if p == port)
            sent = max(1, r["sent"] * (1 + runner.args.warmup / seconds))  # warm-up requests ran too
            r.update(scenario="P6", target=label, server=server, rps=r["ok"] / r["duration_s"], errors=r["errors"],
                     status_errors=r["non_2xx"], load=os.getloadavg()[0],
                     cpu_us_per_req={n: round((after[n] - before[n]) * 1e6 / sent, 1) for n in after})
            runner.raw.append(r)
            results[label].append(r)
            print(f"   P6 {label:<28} {r['rps']:>9.0f} req/s  p50 {r['p50_us'] / 1000:6.2f} ms"
                  f"  p99 {r['p99_us'] / 1000:6.2f} ms  p99.9 {r['p999_us'] / 1000:6.2f} ms", flush=True)
    ref = summarize(results["nginx proxy POST"])
    for runtime in stack.runtimes:
        sub = summarize(results[labelled("guarded POST, Redis", runtime)])
        added = (sub["p99_us"] - ref["p99_us"]) / 1000
        runner.row("P6", labelled(f"p99 at {rate} req/s, Redis", runtime), sub, ("nginx POST", ref), None,
                   "p99 ≤ nginx p99 + 1 ms", added <= 1.0, note=f"added p99: {added:+.2f} ms")


def correctness(runner, stack, procs):
    keys = 5 if runner.args.smoke else 20
    say(f"P5 64 concurrent requests on one key, 3 rounds, {keys} keys, memory and Redis stores")
    ok_all = True
    for store_name, store in (("memory", "memory://"), ("Redis", stack.redis_url)):
        port = free_port()
        counter = procs.start(f"counting-{store_name}", [str(shared.LT), "upstream", "--listen", f"127.0.0.1:{port}",
                                                         "--delay-ms", "50", "--lifetime-ms", "600000"], port)
        gw_port = stack.start_gateway(f"gw-p5-{store_name.lower()}", store, port)
        try:
            burst = lt(["burst", "--target", f"127.0.0.1:{gw_port}", "--keys", str(keys), "--concurrency", "64",
                        "--rounds", "3", "--prefix", f"p5-{store_name}-{NONCE}"], 120)
            counts = json.loads(subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/__counts"],
                                               capture_output=True, text=True, timeout=10).stdout)
        finally:
            procs.stop(counter)
        bad_status = {s: n for s, n in burst["status"].items() if s not in ("201", "409")}
        ok = (counts["calls"] == keys and counts["max_per_key"] == 1 and counts["keys"] == keys
              and not bad_status and burst["errors"] == 0)
        ok_all &= ok
        statuses = ", ".join(f"{n}×{s}" for s, n in burst["status"].items())
        note = (f"{burst['requests']} requests → {counts['calls']} upstream calls for {counts['keys']} keys "
                f"(max {counts['max_per_key']}/key); {statuses} ({burst['replays']} of them replays); "
                f"{burst['errors']} transport errors")
        print(f"   P5 {store_name}: {'ok' if ok else 'FAILED'}: {note}", flush=True)
        runner.raw.append({"scenario": "P5", "target": store_name, "burst": burst, "upstream": counts})
        runner.row("P5", f"one key × 64 concurrent, {store_name}", None, None, None,
                   "1 upstream call per key; only 409 besides success", ok, note)
    return ok_all


def memory_at_connections(runner, stack, procs):
    n = 1000
    hold = 3000
    say(f"P10 gateway RSS at {n} open connections (Redis store)")
    port = stack.start_gateway("gw-p10", stack.redis_url, stack.ports["upstream"])
    pid = stack.pids["gw-p10"]
    try:
        subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/"], timeout=10)
        base = rss_kib(pid)
        holder = subprocess.Popen([str(shared.LT), "hold", "--target", f"127.0.0.1:{port}", "--connections", str(n),
                                   "--hold-ms", str(hold)], stdout=subprocess.PIPE, text=True)
        line = holder.stdout.readline()
        idle = rss_kib(pid)
        holder.wait(timeout=hold / 1000 + 30)
        if not line.strip():
            raise RuntimeError("lt hold did not open its connections")
        seconds = max(1, min(3, runner.args.duration))
        active_settings = argparse.Namespace(**{**vars(runner.args), "connections": n, "threads": 2})
        result = wrk(port, seconds, active_settings, {"LT_METHOD": "POST", "LT_KEYS": "unique",
                                                      "LT_PREFIX": f"p10-{NONCE}"})
        peak = rss_kib(pid, "VmHWM")
    finally:
        procs.stop(next(p for p in procs.procs if p.pid == pid))
    raw = {"scenario": "P10", "target": "gateway", "rss_start_kib": base, "rss_idle_kib": idle,
           "rss_peak_kib": peak, "active": result}
    runner.raw.append(raw)
    mib = lambda k: k / 1024
    print(f"   P10 start {mib(base):.1f} MiB, {n} idle connections {mib(idle):.1f} MiB, peak with {n} active "
          f"{mib(peak):.1f} MiB ({result['rps']:.0f} req/s, {result['errors'] + result['status_errors']} errors)",
          flush=True)
    runner.row("P10", f"RSS, {n} idle connections", None, None, None, "≤ 64 MiB", mib(idle) <= 64,
               f"{mib(idle):.1f} MiB (at start {mib(base):.1f} MiB)")
    runner.row("P10", f"peak RSS, {n} active connections", None, None, None, "≤ 64 MiB", mib(peak) <= 64,
               f"{mib(peak):.1f} MiB (VmHWM; guarded POST, Redis, {result['rps']:.0f} req/s)")
