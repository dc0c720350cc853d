"""Another user binds the port an engine of ours was given, before our server does, and answers like an engine.

Between choosing a free port and the server binding it there is a moment; a stranger who takes the port then (or
after a crash, while the server restarts on the same port) would receive every request of the run, the engine's
API key in each. The actor checks who listens before it sends anything: the port held by another uid is an error
naming it, and the stranger's server sees no request carrying the key. On 04c908e the readiness check took the
stranger's 200 as the engine's and the run went on with it.
"""

import asyncio
import json
import shutil
import socket
import sys
import time

import pytest

from unprivileged import ensure_users, kill_processes_of, popen_as, shared_dir
from uni_agent.engines.server import ServerActor

STRANGER_SERVER = """
import http.server, json, sys
log = open(sys.argv[2], "a")
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        log.write(json.dumps({"path": self.path, "auth": self.headers.get("Authorization")}) + "\\n"); log.flush()
        body = b'{"object": "list", "data": [{"id": "theirs"}]}'
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Answer).serve_forever()
"""


class NeverBinds(ServerActor):
    """A server whose process starts but never listens: the port is the stranger's all along."""

    def command(self, host: str, port: int) -> list[str]:
        return ["sleep", "60"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_port_taken_by_another_user_gets_no_request_of_the_run(tmp_path):
    (stranger,) = ensure_users(["ua-port-stranger"])
    where = shared_dir("uni-agent-port-squat-")
    script, seen = where / "answer.py", where / "seen.jsonl"
    script.write_text(STRANGER_SERVER)
    seen.touch()
    seen.chmod(0o666)
    script.chmod(0o644)
    port = _free_port()
    squatter = popen_as(stranger, [sys.executable, str(script), str(port), str(seen)])
    try:
        deadline = time.monotonic() + 20
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert squatter.poll() is None and time.monotonic() < deadline, squatter.communicate()
            time.sleep(0.1)
        actor = NeverBinds("test engine", str(tmp_path / "engine.log"), api_key="the-runs-secret-key")
        actor._host, actor._port, actor.url = "127.0.0.1", port, f"http://127.0.0.1:{port}/v1"
        with pytest.raises(RuntimeError, match=f"port {port} is held by another user \\(uid {stranger.uid}\\)"):
            asyncio.run(actor.start(timeout=10))
    finally:
        squatter.kill()  # the wrapper that switched users; the squatter itself is the stranger's process
        squatter.wait()
        kill_processes_of(stranger)
    requests = [json.loads(line) for line in seen.read_text().splitlines()]
    shutil.rmtree(where)
    assert not any("the-runs-secret-key" in (r["auth"] or "") for r in requests), requests
