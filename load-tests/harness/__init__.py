"""idemgate's load-test harness, run by load-tests/run (see load-tests/README.md).

shared        paths, the binaries (chosen at run time), the run's nonce, Processes, /proc readers
setup         wrk and nginx, the cargo builds, the gateway scenarios' servers (Stack)
measuring     wrk and `lt`, the Runner that measures and keeps every result
gateway       P5, P6, P10, D1, and the servers of every gateway scenario
throughput    P1–P4, P11 and T1: wrk against nginx and the floors
outbox_stack  PostgreSQL schemas, sinks and relays for the outbox scenarios
outbox        P7–P9 and R1
report        the Markdown results file
cli           the command line and the run itself
"""
