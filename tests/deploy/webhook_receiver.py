# SPDX-License-Identifier: Apache-2.0
"""A local HTTP endpoint for Alertmanager's webhook_configs: records every POST (path, JSON payload). A GET of
/metrics answers `exposition`, a Prometheus text exposition a test sets (empty by default).

Runs in a thread of the test process on 127.0.0.1 (port chosen by the kernel), so there is no process to
clean up; stop() shuts the server down and closes the socket.
"""
import http.server
import json
import threading
import time


class WebhookReceiver:
    def __init__(self):
        self.received = []  # (monotonic time, path, payload dict), in arrival order
        self.errors = []
        self.exposition = ""
        self._cond = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    payload = json.loads(body)
                except ValueError as e:
                    receiver.errors.append(f"{self.path}: not JSON ({e}): {body[:200]!r}")
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver._cond:
                    receiver.received.append((time.monotonic(), self.path, payload))
                    receiver._cond.notify_all()
                self.send_response(200)
                self.end_headers()

            def do_GET(self):
                body = receiver.exposition.encode() if self.path == "/metrics" else b""
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # keep pytest's output for the test's own diagnostics
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True)
        self._thread.start()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def payloads(self, path=None):
        with self._cond:
            return [p for _, pth, p in self.received if path is None or pth == path]

    def notifications(self, path=None):
        """Every (payload status, alert) pair received, flattened, in arrival order."""
        return [(p.get("status"), a) for p in self.payloads(path) for a in p.get("alerts", [])]

    def wait_for(self, predicate, timeout):
        """Wait until predicate(receiver) is true (returns it) or timeout s pass (returns the last value)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                result = predicate(self)
                remaining = deadline - time.monotonic()
                if result or remaining <= 0:
                    return result
                self._cond.wait(min(remaining, 0.5))

    def dump(self):
        with self._cond:
            lines = [f"--- webhook: {len(self.received)} POSTs ---"]
            lines += [f"{t:.1f} {path} {json.dumps(p, sort_keys=True)}" for t, path, p in self.received]
            lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)

    def stop(self):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
