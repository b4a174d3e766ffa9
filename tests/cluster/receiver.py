"""A customer's webhook receiver on the `hooks` host: answers 204 and appends
each delivery (its headers and JSON body) to a file the test reads."""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the harness's "is it up"
            self.send_response(200)
            self.end_headers()

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            record = {"headers": dict(self.headers.items()), "body": json.loads(body or b"{}")}
            with lock, open(args.out, "a") as out:
                out.write(json.dumps(record) + "\n")
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *values: object) -> None:
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
