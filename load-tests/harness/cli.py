"""The command line: parses load-tests/run's flags, runs the scenarios asked for, writes the results.

main() is the whole run: tools and build (setup.py), the gateway's
scenarios (gateway.py), the outbox's (outbox.py, enqueue.py), then the report
(report.py) to --out and a timestamped copy beside it. It exits non-zero
only if the run broke or P5 (correctness) failed.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import shared
from .shared import HERE, Processes, say
from .gateway import gateway_scenarios
from .measuring import Runner
from .outbox import outbox_scenarios
from .report import machine, report
from .setup import Stack, build, ensure_tools, use_profile


def main(doc):
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="every scenario briefly (CI-sized)")
    parser.add_argument("--duration", type=int, help="whole seconds per measurement (full 8, smoke 1)")
    parser.add_argument("--warmup", type=int, help="whole seconds of warm-up before each measurement (full 1, smoke 0)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per scenario (full 3, smoke 1)")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    parser.add_argument("--pin", action="store_true",
                        help="pin the load generator and the servers to separate CPUs (taskset)")
    parser.add_argument("--pin-generator", default="1", help="the generator's CPUs with --pin (default 1)")
    parser.add_argument("--pin-servers", default="0", help="every server's CPUs with --pin (default 0)")
    parser.add_argument("--only", default="", help="comma-separated scenario ids to run (e.g. P1,P5)")
    parser.add_argument("--profile", action="store_true",
                        help="sample idemgate with perf during its measurements; reports in results/profile-*.txt")
    parser.add_argument("--no-build", action="store_true", help="use the binaries already built")
    parser.add_argument("--idemgate", help="run this idemgate binary instead of the one built, "
                                           "${CARGO_TARGET_DIR:-target}/release/idemgate "
                                           "(a before/after comparison: build the other commit, copy it, pass it)")
    parser.add_argument("--no-install", action="store_true", help="never apt-get install wrk/nginx")
    parser.add_argument("--debug", action="store_true",
                        help="build and run debug binaries: quick to build, so CI runs --smoke --debug to keep the "
                             "harness working; the figures then mean nothing")
    parser.add_argument("--runtimes", default="",
                        help="comma-separated idemgate runtimes (per-core,work-stealing): each gateway of P1-P4, "
                             "P6, P11 and T1 runs once per runtime, config field `runtime` written, rows side by "
                             "side; default: the field is not written (the binary's default runtime)")
    parser.add_argument("--out", help="results file (default results/latest.md, smoke: results/smoke.md)")
    args = parser.parse_args()
    # wrk takes whole seconds.
    args.duration = max(1, args.duration or (1 if args.smoke else 8))
    args.warmup = max(0, args.warmup if args.warmup is not None else (0 if args.smoke else 1))
    args.rounds = args.rounds or (1 if args.smoke else 3)
    only = {s.strip().upper() for s in args.only.split(",") if s.strip()}
    wanted = lambda sid: not only or sid in only
    args.runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    unknown = [r for r in args.runtimes if r not in ("per-core", "work-stealing")]
    if unknown or len(set(args.runtimes)) != len(args.runtimes):
        parser.error(f"--runtimes: per-core and/or work-stealing, each once (got {','.join(args.runtimes)})")
    out = Path(args.out) if args.out else HERE / "results" / ("smoke.md" if args.smoke else "latest.md")

    use_profile("debug" if args.debug else "release")
    if args.idemgate:
        shared.GATEWAY = Path(args.idemgate).resolve()
    started = time.time()
    nginx = ensure_tools(args)
    build(args)
    # After the build, which would otherwise count as the machine's own load.
    load_before = os.getloadavg()[0]
    say(f"load average {load_before:.2f} before the scenarios")
    for binary in (shared.GATEWAY, shared.LT, shared.OUTBOX_BENCH):
        if not binary.exists():
            sys.exit(f"{binary} is missing: run without --no-build")
    if not nginx:
        say("nginx is not installed: the nginx reference (P1 ratio, P3, P4, P6, P11, T1) is skipped")
    workdir = Path(tempfile.mkdtemp(prefix="idemgate-lt-"))
    procs = Processes(workdir, args.pin and args.pin_servers)
    stack = Stack(procs, nginx, workdir, args.runtimes or [None])
    runner = Runner(args, stack)
    correct = True
    try:
        if any(wanted(s) for s in ("P1", "P2", "P3", "P4", "P5", "P6", "P10", "P11", "T1", "D1", "W1")):
            correct = gateway_scenarios(runner, stack, procs, nginx, wanted, workdir)
        if any(wanted(s) for s in ("P7", "B1", "B2", "P8", "P9", "R1", "E1", "E2", "E3", "E4")):
            outbox_scenarios(runner, procs, workdir, wanted)
    finally:
        procs.stop_all()
    text, summary = report(runner, machine(), started, (load_before, os.getloadavg()[0]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    (out.parent / f"{'smoke' if args.smoke else 'full'}-{stamp}.md").write_text(text)
    say(f"results: {out} ({time.time() - started:.0f} s); load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after")
    print(summary, flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if correct else 1)
