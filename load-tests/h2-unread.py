#!/usr/bin/env python3
"""The gateway's memory under HTTP/2 clients that never read (issue 33).

    load-tests/h2-unread.py [--binary target/release/idemgate] [--connections 20] [--response-kib 1024]

Starts a local upstream answering every request with --response-kib of
body, and `idemgate serve` (memory store, h2c, send_timeout 10s) in front
of it. Then --connections h2c clients each announce a flow-control window
of 0 (SETTINGS_INITIAL_WINDOW_SIZE = 0), open max_streams_per_connection
(100) guarded POSTs with keys of their own, and never read a byte of any
response. Prints the gateway's resident memory (VmRSS) at rest, while the
clients hold their streams, after send_timeout has dropped them, and its
peak (VmHWM), with what the upstream served. Loopback only; bounded in
count and time (about 30 s); stops everything it starts.

Needs the `h2` package (pip install h2).
"""

import argparse
import http.server
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import h2.config
import h2.connection
import h2.settings


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


class Upstream(http.server.BaseHTTPRequestHandler):
    body = b""
    served = 0
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        Upstream.served += 1
        self.send_response(201)
        self.send_header("content-type", "application/octet-stream")
        self.send_header("content-length", str(len(Upstream.body)))
        self.end_headers()
        self.wfile.write(Upstream.body)

    def log_message(self, *args):
        pass


def unread_client(port, streams, connections):
    """One h2c connection with a zero window, `streams` guarded POSTs, nothing read."""
    sock = socket.create_connection(("127.0.0.1", port))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    sock.sendall(conn.data_to_send())
    for i in range(streams):
        stream = conn.get_next_available_stream_id()
        key = f"unread-{os.getpid()}-{sock.fileno()}-{i}"
        conn.send_headers(stream, [(":method", "POST"), (":path", "/charge"), (":scheme", "http"),
                                   (":authority", f"127.0.0.1:{port}"), ("idempotency-key", key),
                                   ("content-type", "application/json"), ("content-length", "2")])
        conn.send_data(stream, b"{}", end_stream=True)
    sock.sendall(conn.data_to_send())
    connections.append(sock)  # held open, never read


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="target/release/idemgate")
    parser.add_argument("--connections", type=int, default=20)
    parser.add_argument("--response-kib", type=int, default=1024)
    parser.add_argument("--store", default="", help="a store URL (default: the embedded memory store, which "
                        "holds the stored responses in the gateway's own memory)")
    args = parser.parse_args()
    args.store_line = f'store = "{args.store}"' if args.store else ""

    Upstream.body = os.urandom(args.response_kib * 1024)
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port, admin = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "idemgate.toml")
        with open(config, "w") as f:
            f.write(f"""
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin}"
{args.store_line}
[log]
level = "warn"
[gateway]
send_timeout = "10s"
max_stored_response = "{args.response_kib + 1}KiB"
[[routes]]
name = "charges"
upstream = "http://127.0.0.1:{upstream.server_address[1]}"
""")
        gateway = subprocess.Popen([args.binary, "serve", "--config", config])
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or gateway.poll() is not None:
                        sys.exit("the gateway did not start")
                    time.sleep(0.1)
            rest = memory(gateway.pid, "VmRSS")
            held = []
            for _ in range(args.connections):
                unread_client(port, 100, held)
            time.sleep(4)
            holding = memory(gateway.pid, "VmRSS")
            served_while_held = Upstream.served
            time.sleep(10)  # send_timeout (10 s) drops the connections that stopped reading
            after = memory(gateway.pid, "VmRSS")
            peak = memory(gateway.pid, "VmHWM")
            for sock in held:
                sock.close()
            streams = args.connections * 100
            print(f"{args.connections} h2c connections × 100 unread streams of {args.response_kib} KiB "
                  f"({streams * args.response_kib / 1024:,.0f} MiB asked for; upstream served {served_while_held}): "
                  f"gateway RSS at rest {rest:.1f} MiB, holding {holding:.1f} MiB, after send_timeout "
                  f"{after:.1f} MiB, peak {peak:.1f} MiB")
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)
            upstream.shutdown()


if __name__ == "__main__":
    main()
