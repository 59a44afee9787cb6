"""What every part of the harness shares: paths, the binaries it runs, the run's nonce, and processes.

The binaries (LT, GATEWAY, OUTBOX_BENCH) are chosen at run time by
setup.use_profile and --idemgate, so other modules read them as
`shared.GATEWAY` and so on, never by `from .shared import GATEWAY`.
Every process the harness starts goes through Processes, which stops them
by pid; cpu_seconds and rss_kib read /proc.
"""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # load-tests/
ROOT = HERE.parent
# Cargo's target directory, as cargo finds it: CARGO_TARGET_DIR when set and
# not empty (like the shell's ${CARGO_TARGET_DIR:-target}; a relative one is
# relative to the repository root, where the harness runs cargo), else target/.
TARGET = ROOT / (os.environ.get("CARGO_TARGET_DIR") or "target")
TOOLS_TARGET = TARGET / "load-tests"
LT = TOOLS_TARGET / "release" / "lt"
GATEWAY = TARGET / "release" / "idemgate"
LUA = HERE / "wrk" / "request.lua"
OUTBOX_BENCH = TARGET / "release" / "examples" / "outbox-bench"
NONCE = f"{os.getpid()}x{int(time.time())}"


def say(message):
    print(f"== {message}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, seconds=15.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds}s")


class Processes:
    """Every process the harness starts; all are stopped on exit, by pid."""

    def __init__(self, workdir, pin):
        self.workdir = workdir
        self.pin = pin
        self.procs = []

    def start(self, name, argv, port=None, env=None):
        if self.pin:
            argv = ["taskset", "-c", self.pin, *argv]
        log = open(self.workdir / f"{name}.log", "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                cwd=self.workdir, start_new_session=True)
        proc.name = name
        self.procs.append(proc)
        if port:
            wait_for_port(port, proc)
        return proc

    def stop(self, proc):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self):
        for proc in reversed(list(self.procs)):
            self.stop(proc)


def cpu_seconds(pid):
    """User + system CPU of a process and its live child processes (nginx workers)."""
    def own(stat):
        fields = stat.rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if entry.name == str(pid) or fields[1] == str(pid):
            ticks += own(stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_kib(pid, field="VmRSS"):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0
