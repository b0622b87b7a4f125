"""A fake OpenAI-compatible server for launch tests: `python slow_server.py --port P [--startup S]`.

It sleeps S seconds before it binds its port (a server loading weights), then streams completions at a fixed
time per token (--token-ms), so its figures are known: TTFT about one token time, ITL --token-ms. It answers
/health, /v1/models and /metrics (empty); with --die-after N it exits (code 3) on its N+1th request. It
appends `start PORT PID TIME` and, on SIGTERM, `stop PORT PID TIME` (wall clock) to --events, so a test can
tell which servers held which port when, and its environment's CUDA_VISIBLE_DEVICES and its --cpus to its
output (the launch log). Standard library only: it starts in tens of milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--startup", type=float, default=0.0)
    parser.add_argument("--token-ms", type=float, default=2.0)
    parser.add_argument("--events", default=None)
    parser.add_argument("--cpus", default="")
    parser.add_argument("--die-after", type=int, default=0)  # exit (code 3) after this many completions
    parser.add_argument("--label", default="")  # any value: e.g. the trial's budget, echoed in /v1/models
    args = parser.parse_args()

    def event(what: str) -> None:
        if args.events:
            with open(args.events, "a") as out:
                out.write(f"{what} {args.port} {os.getpid()} {time.time():.6f}\n")

    print(
        f"slow_server: pid {os.getpid()} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')} "
        f"cpus={args.cpus} label={args.label}",
        flush=True,
    )
    time.sleep(args.startup)

    served: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *_):  # quiet
            pass

        def reply(self, body: bytes, kind: str = "application/json") -> None:
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self.reply(b"")
            elif self.path == "/v1/models":
                card = {
                    "id": "fake",
                    "object": "model",
                    "max_model_len": 4096,
                    "vocab_size": 32000,
                    "label": args.label,
                    "pid": os.getpid(),
                }
                self.reply(json.dumps({"object": "list", "data": [card]}).encode())
            elif self.path == "/metrics":
                self.reply(b"", "text/plain")
            else:
                self.send_error(404)

        def do_POST(self):
            served.append(1)
            if args.die_after and len(served) > args.die_after:
                os._exit(3)  # mid-run, as a crashed server: no answer, no goodbye
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 1)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for _ in range(tokens):
                time.sleep(args.token_ms / 1000)
                chunk = {"id": "cmpl-1", "choices": [{"index": 0, "text": " x", "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            usage = {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": tokens}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    event("start")

    def stop(*_):
        event("stop")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
