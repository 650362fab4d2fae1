"""The upstream of the budget end-to-end tests (tests/e2e/budgets.rs): an API whose
cost is known only when it answers, as an LLM's token count is.

Every answer is 200 with the response header `x-tokens` set to the request's `x-cost`
header (0 without one), after waiting the request's `x-sleep-ms` (0 without one): a
slow request holds its concurrency slot that long. `GET /ready-probe` answers at once.
Standard library only; one thread per connection.

    python3 budget_upstream.py --port 8000
"""

import argparse
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Budget(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True

    def _answer(self):
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        time.sleep(int(self.headers.get("x-sleep-ms") or 0) / 1000)
        body = b"ok\n"
        self.send_response(200)
        self.send_header("x-tokens", self.headers.get("x-cost") or "0")
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_HEAD = _answer

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with Server((args.host, args.port), Budget) as server:
        print(f"budget upstream on {args.host}:{args.port}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
