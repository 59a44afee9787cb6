"""A deliberately non-idempotent toy API for the compose demo.

Every POST or PATCH performs a new "charge" and says how many it has
performed so far, so the effect of the gateway is visible: a retry with the
same Idempotency-Key gets the stored response back and the counter does not
move. It also echoes the Idempotency-Key it received (what the gateway
forwarded) and answers GET /count with the counter.

Python standard library only, so the stock python image runs it as is.
"""

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATE = {"charges": 0, "deliveries": 0}


class Handler(BaseHTTPRequestHandler):
    server_version = "demo-upstream/1"
    protocol_version = "HTTP/1.1"  # keep-alive; every reply sets content-length

    def _reply(self, status, body):
        data = json.dumps(body, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return {"raw": raw.decode("utf-8", "replace")}

    def do_GET(self):
        if self.path in ("/healthz", "/count"):
            with LOCK:
                self._reply(200, dict(STATE))
        else:
            self._reply(404, {"error": "not found"})

    def _act(self):
        body = self._read_body()
        counter = "deliveries" if self.path.startswith("/v1/notifications") else "charges"
        with LOCK:
            STATE[counter] += 1
            performed = STATE[counter]
        self._reply(201, {
            "path": self.path,
            "request": body,
            "idempotency_key_received": self.headers.get("idempotency-key"),
            counter + "_performed": performed,
        })

    do_POST = _act
    do_PATCH = _act

    def log_message(self, fmt, *args):
        print("demo-upstream: " + (fmt % args), flush=True)


if __name__ == "__main__":
    port = int(os.environ.get("PORT", "9000"))
    print(f"demo-upstream listening on :{port}", flush=True)
    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()
