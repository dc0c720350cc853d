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


# A policy gets the request body and returns an assistant message dict (optionally with "_response", "_choice",
# "_usage": fields merged into the answer), or a Fault.
Policy = Callable[[dict[str, Any]], "dict[str, Any] | Fault"]


def tool_call_message(name: str, arguments: dict[str, Any], content: str = "") -> dict[str, Any]:
    """An assistant message with one structured tool call."""
    return {"role": "assistant", "content": content, "tool_calls": [{
        "id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }]}


def chat_completion(reply: dict[str, Any], body: dict[str, Any], model: str) -> dict[str, Any]:
    """The OpenAI chat.completion answer carrying `reply`. Extra fields an engine adds (e.g. vLLM's token ids):
    "_response", "_choice", "_usage" are merged into the answer, its choice and its usage."""
    reply = dict(reply)
    extra, choice_extra, usage_extra = (reply.pop(k, {}) for k in ("_response", "_choice", "_usage"))
    finish = "tool_calls" if reply.get("tool_calls") else "stop"
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": reply, "finish_reason": finish, **choice_extra}],
        "usage": {"prompt_tokens": sum(len(str(m.get("content", ""))) // 4 for m in body["messages"]),
                  "completion_tokens": len(json.dumps(reply)) // 4, **usage_extra},
        **extra,
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096  # listen backlog: the default (5) drops connects when hundreds of rollouts start at once


class ScriptedLLM:
    """`delay_s`: seconds each reply waits (a latency-controlled endpoint for benchmarks). `keep_requests`: keep every
    request body in `requests` (tests inspect them; a long benchmark would only grow memory). `keep_alive`: HTTP/1.1
    persistent connections, as real servers (vLLM) offer; off by default so that a test which stops the server sees
    the connection refused rather than an old connection still served by its handler thread."""

    def __init__(self, policy: Policy, *, delay_s: float = 0.0, model: str = "scripted", host: str = "127.0.0.1",
                 keep_requests: bool = True, keep_alive: bool = False):
        self.policy, self.delay_s, self.model = policy, delay_s, model
        self.requests: list[dict[str, Any]] = []
        self.keep_requests = keep_requests
        self.num_requests = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

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
                    server.num_requests += 1
                    if server.keep_requests:
                        server.requests.append(body)
                if server.delay_s:
                    time.sleep(server.delay_s)
                reply = server.policy(body)
                if isinstance(reply, Fault):
                    self._send(reply.status, reply.body)
                    return
                self._send(200, json.dumps(chat_completion(reply, body, server.model)))

        self._httpd = _Server((host, 0), Handler)
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
