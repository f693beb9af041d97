"""A small local HTTP server with canned answers, and an OpenAI-style echo answer: the served backend's
stand-in for the tests of the client and of its messages."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Reply = tuple[int, dict, dict[str, str]]  # status, JSON body, headers


class Stub:
    """An HTTP server on 127.0.0.1 whose answer to each request is ``reply(path, body)``."""

    def __init__(self, reply: Callable[[str, dict | None], Reply], delay: float = 0.0):
        self.reply = reply
        self.delay = delay
        self.requests: list[tuple[str, dict | None]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: dict | None) -> None:
                with stub._lock:
                    stub.requests.append((self.path, body))
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                time.sleep(stub.delay)
                status, payload, headers = stub.reply(self.path, body)
                with stub._lock:
                    stub.in_flight -= 1
                data = json.dumps(payload).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer(None)

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                self._answer(json.loads(self.rfile.read(length)))

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def completions(self) -> int:
        return sum(path.endswith("/completions") for path, _ in self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def echo_answer(prompt: str, lps: list[float | None], pieces: list[str], bos: str = "") -> dict:
    """An ``echo: true, logprobs: 1, max_tokens: 1`` answer: ``pieces`` tokenise ``prompt``; one generated
    token follows. ``bos`` is the BOS text a vLLM server puts (and counts in the offsets) first."""
    assert "".join(pieces) == prompt
    tokens = ([bos] if bos else []) + pieces + ["."]
    values = ([None] if bos else []) + lps + [-0.5]
    offsets, at = [], 0
    for tok in tokens:
        offsets.append(at)
        at += len(tok)
    tops = [None if v is None else {tok: v} for tok, v in zip(tokens, values)]
    return {
        "choices": [
            {
                "text": prompt + ".",
                "logprobs": {
                    "tokens": tokens,
                    "text_offset": offsets,
                    "token_logprobs": values,
                    "top_logprobs": tops,
                },
            }
        ],
        "usage": {"prompt_tokens": len(tokens) - 1, "completion_tokens": 1},
    }
