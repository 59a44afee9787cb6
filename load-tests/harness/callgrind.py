"""Instructions per request of one gateway path under callgrind (`load-tests/callgrind`).

The servers are the harness's own (Stack: an nginx upstream, a private
Redis, the gateway's config from gateway_conf); only the gateway runs
under `valgrind --tool=callgrind --instr-atstart=no`. wrk (the harness's
request script, 4 connections) warms it up for 4 s, instrumentation is
switched on for 5 s of wrk, and the total is divided by the requests wrk
counted. Under valgrind the threads run one at a time and sha2 uses its
portable code (valgrind hides SHA-NI), so SHA-256 shows as ~14k Ir per
request that natively costs a few hundred; first requests hand work to a
spawned task, which counts differently from a native run: take their
profile from perf.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import shared
from .measuring import wrk
from .setup import Stack, gateway_conf
from .shared import Processes, free_port, wait_for_port

KEYS = {"replay": "cycle", "first": "unique", "pass": "none"}
# A JSON body and a Content-Type: three headers are stored (server, date, content-type).
UPSTREAM = "server { listen 127.0.0.1:PORT; location / { default_type application/json; return 201 '{\"id\":\"ch_1\"}'; } }"


def main(doc):
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binary", nargs="?", default=str(shared.TARGET / "release" / "idemgate"),
                        help="the idemgate to count (default: the release build)")
    parser.add_argument("mode", nargs="?", default="replay", choices=sorted(KEYS),
                        help="replay: completed keys (200 per connection, made in the warm-up); "
                             "first: a new key each; pass: no key")
    parser.add_argument("store", nargs="?", default="memory", choices=("memory", "redis"))
    parser.add_argument("--floor", action="store_true",
                        help="count the floor (lt floor-proxy, per core) instead of idemgate, on the same requests")
    parser.add_argument("--correct", action="store_true",
                        help="with --floor: the correct floor (lt floor-proxy --correct yes: timeouts, hop-by-hop "
                             "headers removed both ways, the upstream's Host)")
    args = parser.parse_args()
    missing = [tool for tool in ("valgrind", "callgrind_control", "callgrind_annotate", "wrk", "nginx")
               if not shutil.which(tool)]
    args.binary = str(Path(args.binary).resolve())
    if missing or not Path(args.binary).is_file():
        sys.exit(f"callgrind: missing {', '.join(missing) or args.binary} (cargo build --release)")
    workdir = Path(tempfile.mkdtemp(prefix="idemgate-callgrind-"))
    procs = Processes(workdir, None)
    try:
        stack = Stack(procs, shutil.which("nginx"), workdir)
        upstream = stack.start_nginx("upstream", UPSTREAM)
        store = stack.start_redis() if args.store == "redis" else "memory://?max_entries=10000000&max_bytes=2GiB"
        port = free_port()
        conf = gateway_conf(workdir, "gateway", port, store, upstream)
        out = workdir / "callgrind.out"
        counted = [args.binary, "serve", "--config", str(conf)]
        if args.floor:
            counted = [str(shared.LT), "floor-proxy", "--listen", f"127.0.0.1:{port}", "--upstream",
                       f"127.0.0.1:{upstream}", "--runtime", "per-core", "--lifetime-ms", "600000",
                       "--correct", "yes" if args.correct else "no"]
        gateway = procs.start("gateway", ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                          f"--callgrind-out-file={out}", *counted])
        wait_for_port(port, gateway, seconds=60)
        settings = argparse.Namespace(threads=1, connections=4, pin=None)
        env = {"LT_METHOD": "POST", "LT_KEYS": KEYS[args.mode], "LT_SPACE": "200", "LT_PREFIX": f"cg{shared.NONCE}"}
        wrk(port, 4, settings, env)
        subprocess.run(["callgrind_control", "-i", "on", str(gateway.pid)], capture_output=True, check=True)
        measured = wrk(port, 5, settings, env)
        subprocess.run(["callgrind_control", "-i", "off", str(gateway.pid)], capture_output=True, check=True)
        procs.stop(gateway)  # callgrind writes its file at exit
        annotated = subprocess.run(["callgrind_annotate", str(out)], capture_output=True, text=True).stdout
        total = next(int(line.split()[0].replace(",", "")) for line in annotated.splitlines()
                     if "PROGRAM TOTALS" in line)
        requests = measured["requests"]
        subject = ("correct floor" if args.correct else "floor") if args.floor else f"{args.mode}, {args.store}"
        print(f"{subject}: {total // requests} Ir per request ({requests} requests, "
              f"{measured['status_errors']} not 2xx; {out})")
    finally:
        procs.stop_all()
