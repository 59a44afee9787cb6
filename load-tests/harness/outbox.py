"""The outbox's scenarios: P7 throughput, B1/B2 the same to NATS JetStream and RabbitMQ, P8 commit-to-delivery
latency, P9 claim scaling, R1 isolation, and
E1-E4 enqueue rows/s (enqueue.py).

They need PostgreSQL at DATABASE_URL and psql; without either their rows
say *skipped*. Each row, raw measurement and note goes into the Runner
like the gateway scenarios' (see outbox_stack.py for the schemas, sinks
and relays they start).
"""

import json
import os
import shutil
import subprocess
import time

from . import shared
from .shared import cpu_seconds, say
from .enqueue import IDS as ENQUEUE_IDS, enqueue_scenarios
from .outbox_stack import (AMQP_URL, DATABASE_URL, DESTINATION, NATS_URL, SLOW_DESTINATION, Outbox, bench, pct,
                           sink_get, wait_until)


def outbox_scenarios(runner, procs, workdir, wanted):
    if not shutil.which("psql"):
        for sid in ("P7", "B1", "B2", "P8", "P9", "R1", *ENQUEUE_IDS):
            if wanted(sid):
                runner.row(sid, "outbox relay", None, note="skipped: psql is not installed")
        return
    ob = Outbox(procs, workdir)
    try:
        ob.psql("SELECT 1", timeout=10)
    except Exception as e:  # noqa: BLE001
        for sid in ("P7", "B1", "B2", "P8", "P9", "R1", *ENQUEUE_IDS):
            if wanted(sid):
                runner.row(sid, "outbox relay", None, note=f"skipped: no PostgreSQL at DATABASE_URL ({e})")
        return
    ob.drop_orphans()
    try:
        p7 = relay_throughput(runner, ob) if wanted("P7") else None
        if wanted("B1"):
            broker_throughput(runner, ob, "B1", "nats", NATS_URL, p7)
        if wanted("B2"):
            broker_throughput(runner, ob, "B2", "amqp", AMQP_URL, p7)
        if wanted("P8"):
            relay_latency(runner, ob)
        if wanted("P9"):
            claim_scaling(runner, ob)
        if wanted("R1"):
            destination_isolation(runner, ob)
        enqueue_scenarios(runner, ob, wanted)
    finally:
        ob.drop_all()


def relay_throughput(runner, ob):
    rows = 2_000 if runner.args.smoke else 100_000
    say(f"P7 outbox relay throughput: {rows:,} rows to a local HTTP sink")
    schema = ob.schema("p7")
    port, sink = ob.start_sink("sink-p7")
    _, enqueue_s = ob.timed(f"SELECT count({schema}.enqueue('{DESTINATION}', 'p7', 'order:' || i, "
                            f"jsonb_build_object('amount', i))) FROM generate_series(1, {rows}) AS i")
    say(f"   enqueued {rows:,} rows in one transaction in {enqueue_s:.2f} s ({rows / enqueue_s:,.0f} rows/s)")
    started = time.monotonic()
    relay = ob.start_relay("relay-p7", schema, port)
    pid = relay.pid
    cpu_before = cpu_seconds(pid)
    stats = lambda: json.loads(sink_get(port, "/__stats"))
    limit = 60 + rows / 500  # bounded even at 500 rows/s
    last = wait_until(lambda: (s := stats())["distinct"] >= rows and s, limit, 0.2) or stats()
    wait_until(lambda: ob.count(schema) == 0, 30, 0.2)
    drained_s = time.monotonic() - started
    cpu = cpu_seconds(pid) - cpu_before
    left = ob.count(schema)
    db_rate = ob.delivery_rate(schema)
    ob.procs.stop(relay)
    ob.procs.stop(sink)
    span = max(1e-6, (last["last_us"] - last["first_us"]) / 1e6)
    rate = last["distinct"] / span
    cpu_us = cpu * 1e6 / max(1, last["received"])
    raw = dict(scenario="P7", target="relay", rows=rows, enqueue_s=round(enqueue_s, 3),
               enqueue_rows_per_s=round(rows / enqueue_s), received=last["received"], distinct=last["distinct"],
               first_to_last_s=round(span, 3), deliveries_per_s=round(rate), start_to_drained_s=round(drained_s, 3),
               left_in_outbox=left, relay_cpu_us_per_delivery=round(cpu_us, 1), load=os.getloadavg()[0])
    runner.raw.append(raw)
    runner.notes.append(f"- **P7**: {rows:,} rows enqueued by `idemgate.enqueue` in one transaction in "
                        f"{enqueue_s:.2f} s ({rows / enqueue_s:,.0f} rows/s). Relay: {last['distinct']:,} distinct "
                        f"keys ({last['received']:,} requests) from first to last arrival in {span:.2f} s = "
                        f"**{rate:,.0f} deliveries/s**; relay start to empty outbox {drained_s:.2f} s "
                        f"({rows / drained_s:,.0f} rows/s); relay CPU {cpu_us:.0f} µs per delivery; "
                        f"{left} rows left; load {raw['load']:.2f}.")
    print(f"   P7 {last['distinct']:,} delivered in {span:.2f} s: {rate:,.0f} deliveries/s "
          f"(start to drained {drained_s:.2f} s, relay cpu {cpu_us:.0f} µs/delivery, {left} left)", flush=True)
    complete = last["distinct"] == rows and left == 0
    runner.row("P7", f"outbox relay, {rows:,} rows to a local sink — deliveries/s (enqueue "
                     f"{rows / enqueue_s:,.0f} rows/s)" + ("" if complete else
                                                            f"; INCOMPLETE: {last['distinct']} delivered, {left} left"),
               dict(rps=rate, p50_us=None, p99_us=None, cpu_us=cpu_us), None, None, "≥ 10,000 deliveries/s",
               rate >= 10_000 and complete)
    return db_rate


def broker_throughput(runner, ob, sid, kind, url, p7_rate):
    """B1/B2: P7's rows through the relay as shipped to a broker destination, acknowledgements awaited; deliveries/s
    from the first delivery recorded to the last (the database's `delivered_at`), against P7's measured the same way."""
    rows = 2_000 if runner.args.smoke else 100_000
    name = "NATS JetStream" if kind == "nats" else "RabbitMQ"
    say(f"{sid} outbox relay throughput: {rows:,} rows to {name}")
    broker = f"lt-{os.getpid()}-{sid.lower()}"
    try:
        bench(["broker-setup", "--kind", kind, "--url", url, "--name", broker], 60)
    except Exception as e:  # noqa: BLE001
        runner.row(sid, f"outbox relay to {name}", None, note=f"skipped: no broker at {url} ({e})")
        return
    try:
        schema = ob.schema(sid.lower())
        ob.timed(f"SELECT count({schema}.enqueue('{DESTINATION}', 'b', 'order:' || i, "
                 f"jsonb_build_object('amount', i))) FROM generate_series(1, {rows}) AS i")
        relay = ob.start_broker_relay(f"relay-{sid.lower()}", schema, kind, url, broker)
        cpu_before = cpu_seconds(relay.pid)
        wait_until(lambda: ob.count(schema) == 0, 60 + rows / 500, 0.2)
        cpu = cpu_seconds(relay.pid) - cpu_before
        ob.procs.stop(relay)
        left = ob.count(schema)
        held = bench(["broker-count", "--kind", kind, "--url", url, "--name", broker], 60)["messages"]
        rate = ob.delivery_rate(schema)
    finally:
        bench(["broker-delete", "--kind", kind, "--url", url, "--name", broker], 60)
    cpu_us = cpu * 1e6 / max(1, rows)
    ratio = rate / p7_rate if p7_rate else None
    complete = left == 0 and held >= rows
    runner.raw.append(dict(scenario=sid, target="relay", kind=kind, rows=rows, held=held, left_in_outbox=left,
                           deliveries_per_s=round(rate), p7_deliveries_per_s=round(p7_rate or 0),
                           relay_cpu_us_per_delivery=round(cpu_us, 1), load=os.getloadavg()[0]))
    runner.notes.append(f"- **{sid}**: {rows:,} rows to {name} (acknowledgements awaited): **{rate:,.0f} deliveries/s** "
                        f"from the first delivery recorded to the last (P7 measured the same way: "
                        f"{p7_rate or 0:,.0f}/s); the broker holds {held:,}; relay CPU {cpu_us:.0f} µs per delivery; "
                        f"{left} rows left.")
    print(f"   {sid} {rate:,.0f} deliveries/s (P7 the same way {p7_rate or 0:,.0f}/s), broker holds {held:,}, "
          f"relay cpu {cpu_us:.0f} µs/delivery, {left} left", flush=True)
    runner.row(sid, f"outbox relay, {rows:,} rows to {name} — deliveries/s"
               + ("" if complete else f"; INCOMPLETE: broker holds {held}, {left} left"),
               dict(rps=rate, p50_us=None, p99_us=None, cpu_us=cpu_us), None, ratio,
               "≥ 0.9 × P7 (same run)" + ("; ≥ 10,000/s" if kind == "nats" else ""),
               complete and ratio is not None and ratio >= 0.9 and (kind != "nats" or rate >= 10_000))


def relay_latency(runner, ob):
    rate, seconds = 1000, (2 if runner.args.smoke else 10)
    say(f"P8 commit-to-delivery latency at {rate} rows/s for {seconds} s")
    schema = ob.schema("p8")
    port, sink = ob.start_sink("sink-p8")
    relay = ob.start_relay("relay-p8", schema, port)
    # 16 connections: each enqueue waits for its commit's WAL flush, and the
    # enqueuer must keep the rate, whatever a flush costs on this disk.
    common = ["--database-url", DATABASE_URL, "--schema", schema, "--rate", str(rate), "--destination", DESTINATION,
              "--connections", "16"]
    stats = lambda: json.loads(sink_get(port, "/__stats"))
    # Warm-up (not measured): connections open, statements get prepared.
    warm = bench(["enqueue-rate", *common, "--duration-ms", "500", "--prefix", "warm",
                  "--out", str(ob.workdir / "p8-warm.txt")], 60)
    wait_until(lambda: stats()["distinct"] >= warm["sent"], 30)
    commits_file = ob.workdir / "p8-commits.txt"
    cpu_before = cpu_seconds(relay.pid)
    sent = bench(["enqueue-rate", *common, "--duration-ms", str(seconds * 1000), "--prefix", "p8",
                  "--out", str(commits_file)], seconds + 120)
    wait_until(lambda: stats()["distinct"] >= warm["sent"] + sent["sent"], 30)
    cpu = cpu_seconds(relay.pid) - cpu_before
    arrivals = {}
    for line in sink_get(port, "/__dump").splitlines():
        key, at = line.split()
        arrivals.setdefault(key, int(at))
    ob.procs.stop(relay)
    ob.procs.stop(sink)
    latencies, missing = [], 0
    for line in commits_file.read_text().splitlines():
        key, committed = line.split()
        if key in arrivals:
            latencies.append(arrivals[key] - int(committed))
        else:
            missing += 1
    latencies.sort()
    early = sum(1 for l in latencies if l < 0)
    p = {q: pct(latencies, q) for q in (0.5, 0.9, 0.99, 0.999, 1.0)}
    cpu_us = cpu * 1e6 / max(1, len(latencies))
    raw = dict(scenario="P8", target="relay", rate=rate, seconds=seconds, sent=sent["sent"],
               enqueuer_seconds=sent["seconds"],
               enqueuer_max_late_us=sent["max_late_us"], delivered=len(latencies), missing=missing,
               before_commit_returned=early, p50_us=p[0.5], p90_us=p[0.9], p99_us=p[0.99], p999_us=p[0.999],
               max_us=p[1.0], relay_cpu_us_per_delivery=round(cpu_us, 1), load=os.getloadavg()[0])
    runner.raw.append(raw)
    ms = lambda us: f"{us / 1000:.2f}"
    runner.notes.append(f"- **P8**: {sent['sent']:,} rows enqueued at {rate}/s over {seconds} s (in fact "
                        f"{sent['sent'] / sent['seconds']:,.0f}/s; the enqueuer at most "
                        f"{sent['max_late_us'] / 1000:.1f} ms behind schedule), {len(latencies):,} delivered, "
                        f"{missing} missing. Commit-to-delivery p50 {ms(p[0.5])}, p90 {ms(p[0.9])}, "
                        f"p99 {ms(p[0.99])}, p99.9 {ms(p[0.999])}, max {ms(p[1.0])} ms; {early} arrived before "
                        f"their commit returned to the enqueuer; relay CPU {cpu_us:.0f} µs per delivery; "
                        f"load {raw['load']:.2f}.")
    print(f"   P8 {len(latencies):,} delivered ({missing} missing): p50 {ms(p[0.5])} ms, p99 {ms(p[0.99])} ms, "
          f"max {ms(p[1.0])} ms; enqueuer {sent['sent'] / sent['seconds']:,.0f} rows/s, at most "
          f"{sent['max_late_us'] / 1000:.1f} ms late; relay cpu {cpu_us:.0f} µs/delivery", flush=True)
    offered = sent["sent"] / sent["seconds"]
    # Below 90 % of the rate the load was not the one the target names.
    # The enqueuer waits on its commits, so a database stall (a checkpoint,
    # another engineer's build flushing) makes it late too; one of 0.5-1 s
    # costs 5-10 % of a 10 s run and is not what this threshold is about.
    held = offered >= 0.9 * rate
    runner.row("P8", f"commit-to-delivery at {rate} rows/s" + (f" ({missing} MISSING)" if missing else "")
               + ("" if held else f" — NOT AT RATE: the enqueuer reached only {offered:,.0f} rows/s"),
               dict(rps=offered, p50_us=p[0.5], p99_us=p[0.99], cpu_us=cpu_us), None, None,
               "p50 ≤ 10 ms, p99 ≤ 50 ms", p[0.5] <= 10_000 and p[0.99] <= 50_000 and missing == 0 and held)


def fast_beside_slow(ob, tag, rate, seconds, slow_rate, fill):
    """Commit-to-delivery of `rate` rows/s to the fast destination, with `slow_rate` rows/s to a destination
    that answers in 3 s beside it (0: none). The relay serves both either way. Returns (latencies µs, missing,
    enqueuer stats, slow rows delivered meanwhile)."""
    schema = ob.schema(tag)
    port, sink = ob.start_sink(f"sink-{tag}")
    slow_port, slow_sink = ob.start_sink(f"slow-{tag}", delay_ms=3000)
    relay = ob.start_relay(f"relay-{tag}", schema, port, slow_port)
    common = ["--database-url", DATABASE_URL, "--schema", schema]
    stats = lambda p: json.loads(sink_get(p, "/__stats"))
    warm = bench(["enqueue-rate", *common, "--rate", str(rate), "--destination", DESTINATION, "--connections", "16",
                  "--duration-ms", "500", "--prefix", "warm", "--out", str(ob.workdir / f"{tag}-warm.txt")], 60)
    wait_until(lambda: stats(port)["distinct"] >= warm["sent"], 30)
    slow = None
    if slow_rate:
        # Started first, so the slow lane is full (max_in_flight publishes of 3 s each) all through the run.
        slow = subprocess.Popen([str(shared.OUTBOX_BENCH), "enqueue-rate", *common, "--rate", str(slow_rate),
                                 "--destination", SLOW_DESTINATION, "--connections", "2", "--duration-ms",
                                 str((seconds + 4) * 1000), "--prefix", "slow",
                                 "--out", str(ob.workdir / f"{tag}-slow.txt")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: stats(slow_port)["received"] >= fill, 30)
    commits_file = ob.workdir / f"{tag}-commits.txt"
    sent = bench(["enqueue-rate", *common, "--rate", str(rate), "--destination", DESTINATION, "--connections", "16",
                  "--duration-ms", str(seconds * 1000), "--prefix", tag, "--out", str(commits_file)], seconds + 120)
    wait_until(lambda: stats(port)["distinct"] >= warm["sent"] + sent["sent"], 30)
    slow_received = stats(slow_port)["received"]
    if slow is not None:
        slow.kill()
        slow.wait()
    arrivals = {}
    for line in sink_get(port, "/__dump").splitlines():
        key, at = line.split()
        arrivals.setdefault(key, int(at))
    for proc in (relay, sink, slow_sink):
        ob.procs.stop(proc)
    latencies, missing = [], 0
    for line in commits_file.read_text().splitlines():
        key, committed = line.split()
        if key in arrivals:
            latencies.append(arrivals[key] - int(committed))
        else:
            missing += 1
    latencies.sort()
    return latencies, missing, sent, slow_received


def destination_isolation(runner, ob):
    rate, slow_rate, seconds = 500, 60, (2 if runner.args.smoke else 10)
    say(f"R1 destination isolation: {rate} rows/s to a fast destination, alone and beside one answering in 3 s "
        f"({slow_rate} rows/s, more than its max_in_flight can take)")
    runs = {}
    for tag, beside in (("p11a", 0), ("p11b", slow_rate)):
        # Smoke: the slow lane need not be full first (the figures mean nothing there).
        fill = 1 if runner.args.smoke else 128
        latencies, missing, sent, slow_received = fast_beside_slow(ob, tag, rate, seconds, beside, fill)
        p = {q: pct(latencies, q) for q in (0.5, 0.9, 0.99, 1.0)}
        runs[tag] = dict(p=p, missing=missing, sent=sent, slow=slow_received)
        runner.raw.append(dict(scenario="R1", target="fast destination " + ("beside a 3 s one" if beside else "alone"),
                               rate=rate, slow_rate=beside, seconds=seconds, sent=sent["sent"], delivered=len(latencies),
                               missing=missing, slow_requests=slow_received, p50_us=p[0.5], p90_us=p[0.9],
                               p99_us=p[0.99], max_us=p[1.0], load=os.getloadavg()[0]))
    alone, beside = runs["p11a"], runs["p11b"]
    ratio = beside["p"][0.99] / max(1, alone["p"][0.99])
    ms = lambda us: f"{us / 1000:.2f}"
    runner.notes.append(f"- **R1**: {rate} rows/s for {seconds} s to a fast destination (`lt sink`), alone and "
                        f"beside a destination answering in 3 s that was sent {slow_rate} rows/s (its lane full at "
                        f"`max_in_flight` all along; {beside['slow']} requests reached it). Fast commit-to-delivery "
                        f"alone p50 {ms(alone['p'][0.5])} / p99 {ms(alone['p'][0.99])} ms, beside p50 "
                        f"{ms(beside['p'][0.5])} / p99 {ms(beside['p'][0.99])} ms: p99 ratio **{ratio:.2f}**; "
                        f"missing {alone['missing']} and {beside['missing']}.")
    print(f"   R1 p99 alone {ms(alone['p'][0.99])} ms, beside {ms(beside['p'][0.99])} ms: {ratio:.2f}×", flush=True)
    complete = alone["missing"] == 0 and beside["missing"] == 0
    runner.row("R1", f"fast destination's commit-to-delivery beside one answering in 3 s, {rate} rows/s (ratio of "
                      f"p99s)" + ("" if complete else " (ROWS MISSING)"),
               dict(rps=beside["sent"]["sent"] / beside["sent"]["seconds"], p50_us=beside["p"][0.5],
                    p99_us=beside["p"][0.99]),
               ("alone", dict(rps=alone["sent"]["sent"] / alone["sent"]["seconds"], p50_us=alone["p"][0.5],
                              p99_us=alone["p"][0.99])), ratio, "≤ 2 × (p99)", ratio <= 2.0 and complete)


def claim_scaling(runner, ob):
    small, large = 1_000, (20_000 if runner.args.smoke else 1_000_000)
    samples, batch = (20 if runner.args.smoke else 500), 128  # batch: the relay's default batch_size
    say(f"P9 claim latency with {large:,} ready rows vs {small:,} (batch {batch}, {samples} claims each)")
    schemas, loaded = {}, {}
    for n in (small, large):
        schema = ob.schema(f"p9_{n}")
        # The bulk path (not idemgate.enqueue, which is P7's subject): the
        # same columns and derived keys, one INSERT ... SELECT. No ANALYZE
        # after it: a burst lands long before autovacuum's next look, and
        # the claim must not depend on fresh statistics.
        _, took = ob.timed(f"INSERT INTO {schema}.outbox (derived_key, destination, operation, business_key, "
                           f"payload) SELECT {schema}.derived_key('{DESTINATION}', 'p9', 'order:' || i), "
                           f"'{DESTINATION}', 'p9', 'order:' || i, jsonb_build_object('amount', i) "
                           f"FROM generate_series(1, {n}) AS i", timeout=600)
        schemas[n], loaded[n] = schema, took
        say(f"   {n:,} ready rows inserted in {took:.1f} s")
    r = bench(["claim-latency", "--database-url", DATABASE_URL, "--schemas", f"{schemas[small]},{schemas[large]}",
               "--samples", str(samples), "--batch", str(batch), "--destination", DESTINATION], 400)
    sub, ref = r[schemas[large]], r[schemas[small]]
    ratio = sub["p50_us"] / max(1, ref["p50_us"])
    # The tail too: a plan that is slow only until the statement's plan is
    # cached (the first five executions) hides behind a median.
    ratio_p99 = sub["p99_us"] / max(1, ref["p99_us"])
    raw = dict(scenario="P9", target="claim_batch", batch=batch, samples=samples, ratio_p50=round(ratio, 3),
               ratio_p99=round(ratio_p99, 3), load=os.getloadavg()[0],
               **{f"rows_{n}": {**r[schemas[n]], "insert_s": round(loaded[n], 2)} for n in (small, large)})
    runner.raw.append(raw)
    ms = lambda us: f"{us / 1000:.2f}"
    runner.notes.append(f"- **P9**: `claim::claim_batch` (the relay's own claim, batch {batch}) timed "
                        f"{samples}× per table, interleaved; claimed rows are put back (ready, due now) untimed "
                        f"after each claim. {large:,} ready rows: p50 {ms(sub['p50_us'])}, p90 {ms(sub['p90_us'])}, "
                        f"p99 {ms(sub['p99_us'])} ms; {small:,}: p50 {ms(ref['p50_us'])}, p90 {ms(ref['p90_us'])}, "
                        f"p99 {ms(ref['p99_us'])} ms; ratio of p50s {ratio:.2f}, of p99s {ratio_p99:.2f}. Bulk insert of {large:,} rows: "
                        f"{loaded[large]:.1f} s; load {raw['load']:.2f}.")
    print(f"   P9 claim p50 {ms(sub['p50_us'])} ms with {large:,} rows vs {ms(ref['p50_us'])} ms with {small:,}: "
          f"{ratio:.2f}× (p99 {ms(sub['p99_us'])} vs {ms(ref['p99_us'])} ms: {ratio_p99:.2f}×)", flush=True)
    runner.row("P9", f"claim latency, {large:,} vs {small:,} ready rows (batch {batch}; ratio of p50s; "
                     f"of p99s {ratio_p99:.2f})",
               dict(rps=None, p50_us=sub["p50_us"], p99_us=sub["p99_us"]),
               (f"{small:,} ready rows", dict(rps=None, p50_us=ref["p50_us"], p99_us=ref["p99_us"])), ratio,
               "≤ 2 × (p50 and p99)", ratio <= 2.0 and ratio_p99 <= 2.0)
