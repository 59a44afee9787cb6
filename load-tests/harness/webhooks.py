"""W1 (PERFORMANCE.md): verified webhook deliveries against the same route without verification.

One gateway (memory store) with two routes to the static upstream: /webhooks/verified
verifies Stripe's scheme (and so takes the event's "id" as its key), /webhooks/plain
takes the same key (key = { json = "/id" }) and verifies nothing. `lt webhook` sends both
the same Stripe-signed 2 KiB events, signing each as it sends it (wrk cannot compute an
HMAC), so the generator's cost is the same on both sides: first deliveries (a new event
id per request) and redeliveries (each connection cycles through a few ids, all
completed by a first pass). Target: ≥ 0.9 × the unverified route, each way.
"""

from .shared import NONCE, say
from .measuring import generate, met_if, ratio_of

SECRET = f"whsec_load_test_{NONCE}"

ROUTES = f"""
[[routes]]
name = "verified"
prefix = "/webhooks/verified"
upstream = "UPSTREAM"
methods = ["POST"]
webhook = {{ scheme = "stripe", secrets = ["{SECRET}"] }}

[[routes]]
name = "plain"
prefix = "/webhooks/plain"
upstream = "UPSTREAM"
methods = ["POST"]
key = {{ json = "/id" }}
require_key = true
"""


def w1(runner, stack, upstream_port):
    port = stack.start_gateway("gw-webhook", "memory://?max_entries=10000000&max_bytes=2GiB", upstream_port,
                               routes=ROUTES)
    base = {"LT_GENERATOR": "webhook", "LT_SECRET": SECRET, "LT_BODY_BYTES": "2048"}
    verified = {**base, "LT_PATH": "/webhooks/verified"}
    plain = {**base, "LT_PATH": "/webhooks/plain"}
    space = "20" if runner.args.smoke else "200"

    say("W1 first deliveries: Stripe-signed 2 KiB events, a new id each, verified vs the same route unverified")
    r = runner.interleaved("W1", [("plain route, first", port, {**plain, "LT_PREFIX": f"w1p-{NONCE}"}),
                                  ("verified route, first", port, {**verified, "LT_PREFIX": f"w1v-{NONCE}"})])
    sub, ref = r["verified route, first"], r["plain route, first"]
    runner.row("W1", "first deliveries, Stripe scheme, 2 KiB", sub, ("unverified route", ref), ratio_of(sub, ref),
               "≥ 0.9 × unverified", met_if(sub, ref, 0.9))

    say(f"W1 redeliveries ({space} event ids per connection, delivered once first)")
    cycles = [("plain route, redelivered", {**plain, "LT_KEYS": "cycle", "LT_SPACE": space,
                                            "LT_PREFIX": f"w1pr-{NONCE}"}),
              ("verified route, redelivered", {**verified, "LT_KEYS": "cycle", "LT_SPACE": space,
                                               "LT_PREFIX": f"w1vr-{NONCE}"})]
    for _, env in cycles:
        generate(port, max(1, runner.args.warmup), runner.args, env)  # every id delivered (and completed) once
    r = runner.interleaved("W1", [(label, port, env) for label, env in cycles])
    sub, ref = r["verified route, redelivered"], r["plain route, redelivered"]
    runner.row("W1", "redeliveries, Stripe scheme, 2 KiB", sub, ("unverified route", ref), ratio_of(sub, ref),
               "≥ 0.9 × unverified", met_if(sub, ref, 0.9))
