"""A STAND-IN FOR vLLM in tests: vLLM needs a GPU and cannot be installed on the machines the tests run on.

Started as `vllm serve MODEL --served-model-name NAME ... --host H --port P` (a `vllm` shim on PATH runs this file),
it records its argv and environment and serves a small OpenAI-compatible API: /v1/models, and
/v1/chat/completions whose replies are structured tool calls (`execute_bash` for the first TURNS-1 turns, then
`submit`). Everything else about the engine path is real: the Dask actor, placement, the subprocess, readiness,
the router and the agents.

Environment (inherited from the dask worker): FAKE_VLLM_DIR, a directory for the records:
  <pid>.json     argv, CUDA_VISIBLE_DEVICES, pid, parent pid, port
  <pid>.requests one line per chat request served
  control.json   optional, read at every request: {"turns": 2, "crash_devices": "0", "crash_after": 2}
                 -> the server whose CUDA_VISIBLE_DEVICES equals crash_devices exits (code 3) after serving
                 crash_after chat requests, once (a marker file keeps a restarted server alive).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _arg(argv: list[str], flag: str, default: str | None = None) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else default


def main(argv: list[str]) -> None:
    assert argv[:1] == ["serve"], argv
    records = Path(os.environ["FAKE_VLLM_DIR"])
    records.mkdir(parents=True, exist_ok=True)
    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    name = _arg(argv, "--served-model-name", argv[1])
    host, port = _arg(argv, "--host", "127.0.0.1"), int(_arg(argv, "--port", "8000"))
    pid = os.getpid()
    (records / f"{pid}.json").write_text(json.dumps({
        "argv": argv, "cuda_visible_devices": devices, "pid": pid, "ppid": os.getppid(), "port": port}))
    requests_log = records / f"{pid}.requests"
    lock = threading.Lock()
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model"}],
                                 "cuda_visible_devices": devices, "pid": pid})
            else:
                self._send(404, {})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            control_file = records / "control.json"
            control = json.loads(control_file.read_text()) if control_file.exists() else {}
            turn = sum(m["role"] == "assistant" for m in body["messages"])
            if turn + 1 < int(control.get("turns", 2)):
                call = {"name": "execute_bash", "arguments": json.dumps({"command": f"echo turn {turn}"})}
            else:
                call = {"name": "submit", "arguments": "{}"}
            message = {"role": "assistant", "content": "",
                       "tool_calls": [{"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function", "function": call}]}
            # One reply at a time, and the crash decided under the same lock: a request logged here always had its
            # reply written out whole before the process exits (else a lost reply is asked again of the other
            # replica and counted twice).
            with lock:
                served[0] += 1
                with requests_log.open("a") as f:
                    f.write(json.dumps({"model": body.get("model"), "turn": turn}) + "\n")
                self._send(200, {"id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion", "model": name,
                                 "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                                 "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
                marker = records / f"crashed-{devices}"
                if (control.get("crash_devices") == devices and served[0] >= int(control.get("crash_after", 1 << 30))
                        and not marker.exists()):
                    marker.write_text(str(pid))
                    self._close_after_the_reply_is_read()
                    os._exit(3)

        def _close_after_the_reply_is_read(self) -> None:
            """Send FIN after the reply and wait (at most 2 s) for the client to close its end, so the exit cannot
            reset the connection before the reply was read."""
            try:
                self.connection.shutdown(socket.SHUT_WR)
                self.connection.settimeout(2)
                while self.connection.recv(4096):
                    pass
            except OSError:
                pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    print(f"fake vllm: serving {name} on {host}:{port}, CUDA_VISIBLE_DEVICES={devices}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
