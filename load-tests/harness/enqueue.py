"""The enqueue scenarios E1-E4: rows/s into the outbox, row by row and set-based, unordered and ordered.

    E1  idemgate.enqueue once per row, no ordering key
    E2  idemgate.enqueue once per row, 1,000 ordering keys
    E3  idemgate.enqueue_many, one call for every row, no ordering key
    E4  idemgate.enqueue_many, one call for every row, 1,000 ordering keys

Each is one statement through psql (100,000 rows, 2,000 in smoke mode,
~100-byte JSON payloads) in a transaction of its own, timed with its
commit, into a freshly migrated schema (dropped after it: dead rows of
an earlier run would slow the next). The four run interleaved, round by
round (round 2 in reverse order, and so on), and the table gives medians
and ratios from the same run: set-based vs row by row, ordered vs
unordered.
"""

import os
import statistics

from .shared import say
from .outbox_stack import DESTINATION

IDS = ("E1", "E2", "E3", "E4")
KEYS = 1000
# {"note": "x" * 70, "amount": i}: about 100 bytes of JSON text.
PAYLOAD = "jsonb_build_object('amount', i, 'note', repeat('x', 70))"
SCENARIOS = {"E1": ("row by row", False), "E2": ("row by row", True),
             "E3": ("set-based", False), "E4": ("set-based", True)}


def statement(schema, sid, rows):
    form, ordered = SCENARIOS[sid]
    tag = sid.lower()
    business_key = f"'{tag}:' || i"
    ordering_key = f"'customer:' || (i % {KEYS})"
    if form == "row by row":
        key = f", {ordering_key}" if ordered else ""
        return (f"SELECT count({schema}.enqueue('{DESTINATION}', '{tag}', {business_key}, {PAYLOAD}{key})) "
                f"FROM generate_series(1, {rows}) AS i")
    key = f", array_agg({ordering_key})" if ordered else ""
    return (f"SELECT cardinality({schema}.enqueue_many(array_agg('{DESTINATION}'::text), array_agg('{tag}'::text), "
            f"array_agg({business_key}), array_agg({PAYLOAD}){key})) FROM generate_series(1, {rows}) AS i")


def enqueue_scenarios(runner, ob, wanted):
    ids = [sid for sid in IDS if wanted(sid)]
    if not ids:
        return
    rows = 2_000 if runner.args.smoke else 100_000
    rounds = runner.args.rounds
    say(f"E1-E4 enqueue rows/s: {rows:,} rows per call, row by row and set-based, unordered and ordered "
        f"({KEYS:,} ordering keys), {rounds} interleaved round(s): {', '.join(ids)}")
    rates = {sid: [] for sid in ids}
    for r in range(rounds):
        for sid in (ids if r % 2 == 0 else list(reversed(ids))):
            schema = ob.schema(f"{sid.lower()}r{r}")
            _, seconds = ob.timed(statement(schema, sid, rows), timeout=900)
            left = ob.count(schema)
            ob.psql(f"DROP SCHEMA {schema} CASCADE", timeout=120)
            ob.schemas.remove(schema)
            if left != rows:
                raise RuntimeError(f"{sid}: {left} rows in the outbox after enqueueing {rows}")
            rates[sid].append(rows / seconds)
            runner.raw.append(dict(scenario=sid, target=" ".join(map(str, SCENARIOS[sid])), round=r + 1,
                                   rows=rows, seconds=round(seconds, 3), rows_per_s=round(rows / seconds),
                                   load=os.getloadavg()[0]))
            print(f"   {sid} round {r + 1}: {rows / seconds:,.0f} rows/s ({seconds:.2f} s)", flush=True)
    med = {sid: statistics.median(v) for sid, v in rates.items()}
    ratio = lambda a, b: med[a] / med[b] if a in med and b in med else None
    fmt = lambda x: "" if x is None else f"{x:.2f}"
    runner.notes.append(
        f"- **E1–E4**: {rows:,} rows per statement into a fresh schema, ~100-byte payloads, {KEYS:,} ordering "
        f"keys when ordered, timed with the commit; medians of {rounds} interleaved round(s): "
        + ", ".join(f"{sid} {med[sid]:,.0f} rows/s" for sid in ids)
        + f". Set-based vs row by row: unordered {fmt(ratio('E3', 'E1'))}, ordered {fmt(ratio('E4', 'E2'))}; "
          f"ordered vs unordered: row by row {fmt(ratio('E2', 'E1'))}, set-based {fmt(ratio('E4', 'E3'))}.")
    what = lambda sid: (f"enqueue, {SCENARIOS[sid][0]}, {'ordered' if SCENARIOS[sid][1] else 'unordered'}, "
                        f"{rows:,} rows — rows/s")
    cell = lambda sid: dict(rps=med[sid], p50_us=None, p99_us=None)
    if "E1" in med:
        runner.row("E1", what("E1") + " (`idemgate.enqueue` per row)", cell("E1"))
    if "E2" in med:
        runner.row("E2", what("E2"), cell("E2"), ("E1", cell("E1")) if "E1" in med else None, ratio("E2", "E1"))
    if "E3" in med:
        runner.row("E3", what("E3") + " (`idemgate.enqueue_many`)", cell("E3"),
                   ("E1", cell("E1")) if "E1" in med else None, ratio("E3", "E1"), "≥ 100,000 rows/s",
                   med["E3"] >= 100_000)
    if "E4" in med:
        e4 = ratio("E4", "E3")
        runner.row("E4", what("E4") + (f"; vs E2 {fmt(ratio('E4', 'E2'))}" if "E2" in med else ""), cell("E4"),
                   ("E3", cell("E3")) if "E3" in med else None, e4, "≥ 0.8 × E3",
                   None if e4 is None else e4 >= 0.8)
