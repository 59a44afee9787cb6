"""The closed-loop throughput scenarios: P1–P4, P11 and T1 (wrk, subjects and references interleaved).

Every subject is read against nginx and, where PERFORMANCE.md sets one,
against its floor measured in the same rounds: P1 (passthrough) against
`lt floor-proxy` per core, the replays (P4, P11) against `lt floor-answer`,
the replay floor. The floors have no log; with logs on, idemgate's default
request log and nginx's access log are compared, and the floor is still
the log-free one. With --runtimes each idemgate gateway runs once per
runtime, all in the same rounds, one row each. T1 drives passthrough and
memory replays on few long-lived connections (`-c2`, `-c4`, a sidecar's).
"""

from .shared import NONCE, say
from .measuring import met_if, ratio_of, wrk
from .setup import gateway_name

GET = {"LT_METHOD": "GET", "LT_KEYS": "none"}
POST = {"LT_METHOD": "POST", "LT_KEYS": "none"}
UNIQUE = {"LT_METHOD": "POST", "LT_KEYS": "unique"}
FEW_CONNECTIONS = (2, 4)


def labelled(label, runtime):
    return f"{label} [{runtime}]" if runtime else label


def throughput(runner, stack, has_nginx, wanted):
    space = "100" if runner.args.smoke else "1000"
    cycle = {"LT_METHOD": "POST", "LT_KEYS": "cycle", "LT_SPACE": space}
    memory_cycle = {**cycle, "LT_PREFIX": f"replay-memory-{NONCE}"}
    if wanted("P1"):
        p1(runner, stack, has_nginx)
        p1(runner, stack, has_nginx, logged=True)
    if wanted("P2"):
        p2(runner, stack)
    for sid, what in (("P3", "unique keys, Redis store"), ("P4", "replays, Redis store"),
                      ("P11", "replays, memory store")):
        if wanted(sid) and not has_nginx:
            runner.row(sid, what, None, note="skipped: nginx (the reference) is not installed")
    if wanted("P3") and has_nginx:
        p3(runner, stack)
    if wanted("P4") and has_nginx:
        say(f"P4 replays of completed keys, Redis store ({space} keys per wrk thread, completed first)")
        replays(runner, stack, "P4", "gw-redis", ("replays, Redis", "replays, Redis store"), "nginx-proxy",
                {**cycle, "LT_PREFIX": f"replay-{NONCE}"}, "≥ 1.0 × nginx", 1.0)
    if wanted("P11") and has_nginx:
        say(f"P11 replays of completed keys, memory store ({space} keys per wrk thread, completed first)")
        replays(runner, stack, "P11", "gw-memory", ("replays, memory", "replays, memory store"), "nginx-proxy",
                memory_cycle, "≥ 1.5 × nginx", 1.5)
        say("P11 with logs on: idemgate's default request log vs nginx's access log, both to a file")
        replays(runner, stack, "P11", "gw-logged", ("replays, memory, request log", "replays, memory store, logs on"),
                "nginx-proxy-logged", {**cycle, "LT_PREFIX": f"replay-logged-{NONCE}"}, "≥ 1.5 × nginx", 1.5)
    if wanted("T1") and has_nginx:
        few_connections(runner, stack, memory_cycle)
    elif wanted("T1"):
        runner.row("T1", "few long-lived connections", None, note="skipped: nginx (the reference) is not installed")


def p1(runner, stack, has_nginx, logged=False):
    """P1: idemgate's passthrough against nginx and the per-core floor (and the work-stealing one, logs off)."""
    if logged:
        say("P1 passthrough with logs on: idemgate's default request log vs nginx's access log, both to a file")
    else:
        say("P1 passthrough: unguarded GET, both logs off")
    gateway, nginx, what = ("gw-logged", "nginx-proxy-logged", "passthrough GET, logs on") if logged else \
        ("gw-memory", "nginx-proxy", "passthrough GET")
    floor_label = "floor, per core (no log)" if logged else "floor, per core"
    targets = [(floor_label, stack.ports["floor-proxy"], GET)]
    if not logged:
        targets = [("direct upstream", stack.ports["upstream"], GET), *targets,
                   ("floor, work-stealing", stack.ports["floor-proxy-ws"], GET)]
    if has_nginx:
        targets.append(("nginx proxy, access log" if logged else "nginx proxy", stack.ports[nginx], GET))
    subjects = [(runtime, labelled("idemgate passthrough" + (", request log" if logged else ""), runtime))
                for runtime in stack.runtimes]
    targets += [(label, stack.ports[gateway_name(gateway, runtime)], GET) for runtime, label in subjects]
    r = runner.interleaved("P1", targets)
    ref = r.get("nginx proxy, access log" if logged else "nginx proxy")
    floor = ("floor", r[floor_label])
    note = "idemgate's default request log vs nginx's access log; the floor has no log" if logged else ""
    for runtime, label in subjects:
        sub = r[label]
        runner.row("P1", labelled(what, runtime), sub, ref and ("nginx", ref), ratio_of(sub, ref),
                   "≥ 0.95 × floor (× nginx reported)", met_if(sub, floor[1], 0.95), note, floor=floor)
    if not logged:
        runner.row("P1", "(floor) minimal hyper proxy, per core", floor[1], ref and ("nginx", ref),
                   ratio_of(floor[1], ref), "the floor (no target)")
        runner.row("P1", "(floor) the same on a work-stealing runtime", r["floor, work-stealing"],
                   ref and ("nginx", ref), ratio_of(r["floor, work-stealing"], ref),
                   "measured: the runtime model's cost", floor=floor)
        runner.row("P1", "(ceiling) direct GET", r["direct upstream"])


def p2(runner, stack):
    say("P2 first requests, unique keys, memory store")
    targets = []
    for runtime in stack.runtimes:
        port = stack.ports[gateway_name("gw-memory", runtime)]
        targets += [(labelled("passthrough POST (no key)", runtime), port, POST),
                    (labelled("guarded POST, memory", runtime), port,
                     {**UNIQUE, "LT_PREFIX": f"p2-{runtime}-{NONCE}"})]
    r = runner.interleaved("P2", targets)
    for runtime in stack.runtimes:
        sub, ref = r[labelled("guarded POST, memory", runtime)], r[labelled("passthrough POST (no key)", runtime)]
        runner.row("P2", labelled("unique keys, memory store", runtime), sub, ("passthrough POST", ref),
                   ratio_of(sub, ref), "≥ 0.8 × passthrough", met_if(sub, ref, 0.8))


def p3(runner, stack):
    say("P3 first requests, unique keys, Redis store")
    targets = [("nginx proxy POST", stack.ports["nginx-proxy"], {**UNIQUE, "LT_PREFIX": f"p3n-{NONCE}"})]
    targets += [(labelled("guarded POST, Redis", runtime), stack.ports[gateway_name("gw-redis", runtime)],
                 {**UNIQUE, "LT_PREFIX": f"p3-{runtime}-{NONCE}"}) for runtime in stack.runtimes]
    r = runner.interleaved("P3", targets)
    ref = r["nginx proxy POST"]
    for runtime in stack.runtimes:
        sub = r[labelled("guarded POST, Redis", runtime)]
        runner.row("P3", labelled("unique keys, Redis store", runtime), sub, ("nginx POST", ref),
                   ratio_of(sub, ref), "≥ 0.45 × nginx", met_if(sub, ref, 0.45))


def replays(runner, stack, sid, gateway, names, nginx, cycle, target, factor):
    """P4 and P11: replays of completed keys against nginx proxying the same requests and the replay floor.

    names: the subject's label in the raw table and its row's name in the summary.
    """
    for runtime in stack.runtimes:  # complete every key once
        wrk(stack.ports[gateway_name(gateway, runtime)], max(1, runner.args.warmup), runner.args, cycle)
    logged = nginx.endswith("logged")
    nginx_label = "nginx proxy POST, access log" if logged else "nginx proxy POST"
    floor_label = "replay floor (fixed 201, no log)" if logged else "replay floor (fixed 201)"
    targets = [(nginx_label, stack.ports[nginx], cycle), (floor_label, stack.ports["floor-answer"], cycle)]
    subjects = [(runtime, labelled(names[0], runtime)) for runtime in stack.runtimes]
    targets += [(label, stack.ports[gateway_name(gateway, runtime)], cycle) for runtime, label in subjects]
    r = runner.interleaved(sid, targets)
    ref, floor = r[nginx_label], ("replay floor", r[floor_label])
    note = "idemgate's default request log vs nginx's access log; the floor has no log" if logged else ""
    for runtime, label in subjects:
        sub = r[label]
        runner.row(sid, labelled(names[1], runtime), sub, ("nginx POST", ref), ratio_of(sub, ref),
                   target, met_if(sub, ref, factor), note, floor=floor)
    if not logged:
        runner.row(sid, "(replay floor) hyper per core answering a fixed 201", floor[1], ("nginx POST", ref),
                   ratio_of(floor[1], ref), "the replay floor (no target)")


def few_connections(runner, stack, memory_cycle):
    """T1: passthrough and memory replays on -c2 and -c4, against nginx there and the same run's -c32 figure.

    The per-core floor runs at the same -c (the kernel may hash both of two
    connections to one core's listener); the replay floor does not, to keep
    the full run's length in bounds.
    """
    counts = list(FEW_CONNECTIONS)
    wide = {runtime: (runner.summaries.get(("P1", labelled("idemgate passthrough", runtime))),
                      runner.summaries.get(("P11", labelled("replays, memory", runtime))))
            for runtime in stack.runtimes}
    if any(None in pair for pair in wide.values()):
        counts.append(runner.args.connections)  # P1 or P11 did not run: T1 measures its own -c32
    for runtime in stack.runtimes:
        wrk(stack.ports[gateway_name("gw-memory", runtime)], max(1, runner.args.warmup), runner.args, memory_cycle)
    for n in counts:
        say(f"T1 few long-lived connections: passthrough and memory replays at wrk -c{n}")
        targets = [(f"nginx proxy -c{n}", stack.ports["nginx-proxy"], GET),
                   (f"floor, per core -c{n}", stack.ports["floor-proxy"], GET),
                   (f"nginx proxy POST -c{n}", stack.ports["nginx-proxy"], memory_cycle)]
        for runtime in stack.runtimes:
            port = stack.ports[gateway_name("gw-memory", runtime)]
            targets += [(labelled(f"idemgate passthrough -c{n}", runtime), port, GET),
                        (labelled(f"replays, memory -c{n}", runtime), port, memory_cycle)]
        runner.interleaved("T1", targets, connections=n)
    for n in FEW_CONNECTIONS:
        for runtime in stack.runtimes:
            for what, subject, nginx, floor, wide_index in (
                    ("passthrough GET", "idemgate passthrough", "nginx proxy", "floor, per core", 0),
                    ("replays, memory store", "replays, memory", "nginx proxy POST", None, 1)):
                sub = runner.summaries[("T1", labelled(f"{subject} -c{n}", runtime))]
                ref = runner.summaries[("T1", f"{nginx} -c{n}")]
                c32 = wide[runtime][wide_index] or runner.summaries[
                    ("T1", labelled(f"{subject} -c{runner.args.connections}", runtime))]
                note = f"× its -c{runner.args.connections} figure ({c32['rps']:,.0f} req/s): " \
                       f"{sub['rps'] / c32['rps']:.2f}" if c32["rps"] else ""
                runner.row("T1", labelled(f"{what}, -c{n}", runtime), sub, (f"nginx -c{n}", ref),
                           ratio_of(sub, ref), "measured (no target)", None, note,
                           floor=floor and ("floor", runner.summaries[("T1", f"{floor} -c{n}")]))
