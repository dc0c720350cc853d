"""A real OpenAI-compatible HTTP server whose replies come from a Python function instead of a model.

It lets tests and benchmarks drive the whole system (HTTP client, parsing, tools, sandboxes, Dask) with
deterministic agent behaviour, an optional delay per reply, and injected faults. It is not a stand-in for the
model in the end-to-end test, which uses the real llama.cpp server.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Fault:
    """Answer a request with an HTTP error (or a raw body) instead of a reply."""

    status: int = 500
    body: str = '{"error": {"message": "injected fault"}}'


# A policy gets the request body and returns an assistant message dict, or a Fault.
Policy = Callable[[dict[str, Any]], "dict[str, Any] | Fault"]


def tool_call_message(name: str, arguments: dict[str, Any], content: str = "") -> dict[str, Any]:
    """An assistant message with one structured tool call."""
    return {"role": "assistant", "content": content, "tool_calls": [{
        "id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }]}


class ScriptedLLM:
    def __init__(self, policy: Policy, *, delay_s: float = 0.0, model: str = "scripted", host: str = "127.0.0.1"):
        self.policy, self.delay_s, self.model = policy, delay_s, model
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, json.dumps({"object": "list", "data": [{"id": server.model, "object": "model"}]}))
                else:
                    self._send(404, "{}")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                body["_headers"] = dict(self.headers)
                with server._lock:
                    server.requests.append(body)
                if server.delay_s:
                    time.sleep(server.delay_s)
                reply = server.policy(body)
                if isinstance(reply, Fault):
                    self._send(reply.status, reply.body)
                    return
                finish = "tool_calls" if reply.get("tool_calls") else "stop"
                self._send(200, json.dumps({
                    "id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion", "model": server.model,
                    "choices": [{"index": 0, "message": reply, "finish_reason": finish}],
                    "usage": {"prompt_tokens": sum(len(str(m.get("content", ""))) // 4 for m in body["messages"]),
                              "completion_tokens": len(json.dumps(reply)) // 4},
                }))

        self._httpd = ThreadingHTTPServer((host, 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
