"""A tiny demo upstream for tollgate's Envoy setup (docker-compose and the e2e tests).

Answers every request with 200 and a JSON body echoing the method, the path and the
request headers it received, so a client can see what Envoy forwarded (for example
x-ratelimit-shadow-exceeded). Standard library only; one thread per connection;
HTTP/1.1 keep-alive, as Envoy's upstream connection pool expects. Each answer leaves
in one send (see Echo), so no answer waits on the peer's delayed ACK.

    python3 echo.py [--host 0.0.0.0] [--port 8000]
"""

import argparse
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tollgate-demo-upstream"
    # Why both: by default the handler writes unbuffered, so the headers and the body
    # leave in two sends. Nagle then holds the body until the headers are ACKed, and
    # the peer delays that ACK by ~40 ms: 44 ms added to every answer on a reused
    # connection (measured with 60 keep-alive requests). A buffered writer (flushed
    # by the base class after each request) makes the answer one send; TCP_NODELAY
    # keeps an answer larger than the buffer from waiting too.
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True

    def _answer(self):
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps(
            {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
            },
            sort_keys=True,
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _answer

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # The default listen backlog (5) drops connections under a burst.
    request_queue_size = 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    # As PID 1 in a container SIGTERM would otherwise be ignored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = Server((args.host, args.port), Echo)
    print(f"echo upstream listening on {args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
