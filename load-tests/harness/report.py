"""The report: the Markdown results file (summary table, raw measurements, relay notes, JSON) and the machine.

report() returns the whole file and the summary table alone, which the
run prints at the end; machine() describes what the figures came from.
"""

import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

from .shared import ROOT


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    version = lambda argv: subprocess.run(argv, capture_output=True, text=True).stderr.strip() or \
        subprocess.run(argv, capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "commit": commit + (" (+ uncommitted src changes)" if dirty else ""),
            "wrk": " ".join(version(["wrk", "-v"]).split()[:2]) if shutil.which("wrk") else None,
            "nginx": version(["nginx", "-v"]).removeprefix("nginx version: ") if shutil.which("nginx") or Path("/usr/sbin/nginx").exists() else None}


def cpu_cell(r):
    cpu = r.get("cpu_us_per_req")
    if not cpu:
        return ""
    extra = [f"{cpu[n]:.0f}" for n in ("redis", "upstream") if n in cpu and n != r["server"] and cpu[n] >= 1]
    return f"{cpu[r['server']]:.0f}" + (f" ({', '.join(extra)})" if extra else "")


def floor_cell(measured, floor):
    """`0.71 × floor` style: the subject's req/s over its floor's, measured in the same rounds."""
    if not measured or not floor or not floor[1]["rps"]:
        return ""
    return f"{measured['rps'] / floor[1]['rps']:.2f} ({floor[0]})"


def fmt_ms(us):
    return "" if us is None else f"{us / 1000:.2f}"


def fmt_rps(rps):
    return "" if rps is None else f"{rps:,.0f}"


def report(runner, info, started, loads):
    args = runner.args
    summary = []
    build = "DEBUG build (figures meaningless)" if args.debug else "release build"
    runtimes = (f"runtime {' and '.join(args.runtimes)} (config `runtime`, one gateway each)" if args.runtimes
                else "its default runtime")
    lines = [f"# idemgate load tests — {'smoke' if args.smoke else 'full'} run",
             "",
             f"- when: {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(started))}, "
             f"took {time.time() - started:.0f} s; commit {info['commit']}",
             f"- machine: {info['nproc']} × {info['cpu']}, {info['memory_gib']} GiB, Linux {info['kernel']}; "
             f"load average {loads[0]:.2f} before, {loads[1]:.2f} after (shared machine: other builds ran too)",
             f"- generator: {info['wrk']} `-t{args.threads} -c{args.connections}`, {args.duration:g} s per "
             f"measurement after {args.warmup:g} s warm-up, {args.rounds} interleaved round(s), medians; "
             f"P6: `lt rate` (open loop, 64 connections, latency from scheduled send time)",
             f"- pinning: {f'generator on CPU {args.pin_generator}, servers on CPU {args.pin_servers}' if args.pin else 'none (all processes share both cores)'}",
             f"- servers: upstream = {info['nginx']} `return 200 \"ok\"` (2 workers); nginx proxy = `proxy_pass` "
             f"with upstream keepalive, 2 workers; idemgate {build}, {runtimes}; "
             f"access logs off on both except in the *logs on* rows; own redis-server",
             f"- floors (`lt`, {build}, no log): *floor* = `lt floor-proxy`, "
             f"a minimal hyper 1.x proxy, one current-thread runtime per core with its own `SO_REUSEPORT` listener "
             f"and upstream pool (its work-stealing twin is reported too); *replay floor* = `lt floor-answer`, the "
             f"same server answering a fixed `201 ok`",
             "",
             "req/s and latencies are medians over rounds as the generator saw them; *cpu* is the CPU time the "
             "measured server spent per request (its own process and workers), the steadiest number on a shared "
             "machine. *ratio* is against the row's reference; *× floor* against the floor measured in the same "
             "rounds (the per-core proxy for passthrough, the replay floor for replays).",
             "",
             "| id | scenario | req/s | p50 ms | p99 ms | cpu µs/req | reference | ref req/s | ref p99 ms "
             "| ref cpu µs/req | ratio | × floor | target | met |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|"]
    for row in runner.rows:
        m, ref = row["measured"], row["reference"]
        met = {True: "yes", False: "**no**", None: ""}[row["met"]]
        cells = [row["scenario"], row["what"]]
        cpu = lambda r: f"{r['cpu_us']:.0f}" if r.get("cpu_us") is not None else ""
        cells += [fmt_rps(m["rps"]), fmt_ms(m["p50_us"]), fmt_ms(m["p99_us"]), cpu(m)] if m else [""] * 4
        cells += [ref[0], fmt_rps(ref[1]["rps"]), fmt_ms(ref[1]["p99_us"]), cpu(ref[1])] if ref else [""] * 4
        cells += [f"{row['ratio']:.2f}" if row["ratio"] is not None else "", floor_cell(m, row.get("floor")),
                  row["target"], met]
        if row["note"]:
            cells[1] += f" — {row['note']}"
        if m and m.get("errors"):
            cells[1] += f" ({m['errors']} errors)"
        lines.append("| " + " | ".join(cells) + " |")
        summary.append(lines[-1])
    lines += ["", "P7: *req/s* is deliveries/s (first to last arrival at the sink), *cpu* the relay's CPU per "
              "delivery. P8: *req/s* is the rate the enqueuer reached, *p50/p99* are commit-to-delivery (the enqueuer's commit returned → sink received). P9: "
              "*p50/p99* are the relay's claim statement with the large table; the reference is the small one. "
              "R1: *p50/p99* are the fast destination's commit-to-delivery beside a destination answering in "
              "3 s; the reference is the same destination alone. E1–E4: *req/s* is rows enqueued per second (median of "
              "the rounds), the ratio against the row named as reference.",
              "", "## Raw measurements", "",
              "| id | target | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | errors | non-2xx | load "
              "| cpu µs/req: server (redis, upstream) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in runner.raw:
        if "rps" not in r:
            continue
        lines.append(f"| {r['scenario']} | {r['target']} | {r['rps']:,.0f} | {fmt_ms(r['p50_us'])} | "
                     f"{fmt_ms(r['p90_us'])} | {fmt_ms(r['p99_us'])} | {fmt_ms(r['p999_us'])} | "
                     f"{fmt_ms(r['max_us'])} | {r['errors']} | {r['status_errors']} | {r['load']:.2f} | "
                     f"{cpu_cell(r)} |")
    if runner.notes:
        lines += ["", "### Outbox relay and enqueue (P7–P9, R1, E1–E4)", "", *runner.notes]
    lines += ["", "```json", json.dumps({"machine": info, "raw": runner.raw}, indent=1), "```", ""]
    header = next(i for i, l in enumerate(lines) if l.startswith("| id | scenario"))
    return "\n".join(lines), "\n".join(lines[header:header + 2] + summary)
