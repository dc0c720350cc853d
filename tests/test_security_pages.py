"""The run's pages answer only the run: another real user of the node (created with useradd; skipped where that cannot
be done) asks every page and JSON route of the run's scheduler (Dask's dashboard, its JSON and /info pages,
/sitemap.json, /metrics, a bokeh websocket, the uni-agent page, its state and a rollout's JSON) without the token,
with a wrong one (query, bearer, cookie), and gets 403 with nothing in it; then knocks on the scheduler's, worker's and
nanny's TLS ports. None of it prints a line on the run's terminal. The run's user, with the token from the printed
link: the first visit sets the cookie and redirects, the cookie alone then works, bearer works for /metrics and the
JSON, and the token file holds the same token, 0600.

The run is the driver's own code path (cluster_client, as `uni-agent run` starts it, and the uni-agent plugin the run
registers) in a process of its own, so its stderr is the terminal a user would see; one finished rollout carrying a
hidden test name stands in for a run's rollouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from unprivileged import ensure_user, remove_users, run_as

STRANGER = Path(__file__).parent / "stranger.py"
OTHER_USER = "ua-pages-other"
HIDDEN = "test_hidden_fail_to_pass_name_7f3a"  # a FAIL_TO_PASS test name: only the run's user may read it
RUN, INSTANCE = "run-pages", "astropy__astropy-7"
ROUTES = ["/status", "/json/identity.json", "/info/main/workers.html", "/sitemap.json", "/metrics", "/health",
          "/uni-agent", "/uni-agent/api/state.json", f"/uni-agent/api/state.json?run={RUN}",
          f"/uni-agent/api/rollout/{RUN}/{INSTANCE}/0.json"]
# Lines a loaded machine may print whoever knocks (the event loop or the GC was slow): not a stranger's doing.
LOAD_NOISE = ("Event loop was unresponsive", "full garbage collections took")

DRIVER = f"""
import asyncio, json, sys
from uni_agent.dashboard import UniAgentDashboard
from uni_agent.driver.cluster import cluster_client
from uni_agent.events import TOPIC, rollout_event
from uni_agent.logs import configure_logging
from uni_agent.settings import load_settings

async def main():
    configure_logging(sys.argv[1], "driver")
    async with cluster_client(load_settings(local_workers=1)) as client:
        await client.register_plugin(UniAgentDashboard())  # as the runner does
        info = await client.scheduler.identity(n_workers=-1)
        worker, about = next(iter(info["workers"].items()))
        messages = json.dumps([{{"role": "user", "content": "fix it"}}])
        await client.log_event(TOPIC, rollout_event({RUN!r}, {INSTANCE!r}, 0, "done", worker=worker, reward=1.0,
                                                    exit_reason="submitted", num_turns=1, messages=messages,
                                                    verification=json.dumps({{"FAIL_TO_PASS": [{HIDDEN!r}]}})))
        print(json.dumps({{"addresses": [client.scheduler.address, worker, about["nanny"]],
                          "port": client.cluster.scheduler.http_server.port}}), flush=True)
        await asyncio.to_thread(sys.stdin.read)

asyncio.run(main())
"""

STRANGER_HTTP = r"""
import http.client, json, sys
port, routes = int(sys.argv[1]), json.loads(sys.argv[2])

def ask(path, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    body = response.read().decode("utf-8", "replace")
    conn.close()
    return [response.status, body[:3000], response.getheader("Set-Cookie")]

def wrong_token(path):
    return ask(path + ("&" if "?" in path else "?") + "token=not-the-token")

ways = {"no token": ask, "wrong token": wrong_token,
        "wrong bearer": lambda p: ask(p, {"Authorization": "Bearer not-the-token"}),
        "forged cookie": lambda p: ask(p, {"Cookie": f"uni-agent-token-{port}=not-the-token"})}
out = {path: {way: call(path) for way, call in ways.items()} for path in routes}
out["/status/ws (bokeh websocket)"] = {"no token": ask("/status/ws", {
    "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})}
print(json.dumps(out))
"""


@pytest.fixture
def other_user():
    user = ensure_user(OTHER_USER)  # skips with the reason where users cannot be created (not root)
    yield user
    remove_users([OTHER_USER])


class Driver:
    """The run's process; its stderr (the user's terminal) read line by line as it comes, with the time it came."""

    def __init__(self, tmp_path: Path):
        self.home, self.log_dir = tmp_path / "home", tmp_path / "logs"
        self.home.mkdir(mode=0o700)
        env = {**os.environ, "HOME": str(self.home)}  # the token file goes to this user's ~/.config
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(self.log_dir)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=tmp_path)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line))

    def started(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            pytest.fail("the run did not start:\n" + self.stderr())
        # the links were printed before this line, but the stderr reader may not have taken them yet (a loaded
        # machine): what the stranger makes the run print is counted from after them
        deadline = time.monotonic() + 60
        while "uni-agent page:" not in self.stderr() and time.monotonic() < deadline:
            time.sleep(0.1)
        return json.loads(line)

    def stderr(self, since: float = 0.0) -> str:
        return "".join(text for t, text in list(self.lines) if t >= since)

    def token(self, port: int) -> str | None:
        """The token in the printed link (the pages' address), None when the link carries none."""
        found = re.search(rf"dask dashboard: http://127\.0\.0\.1:{port}/status\?token=([\w-]+)\n", self.stderr())
        return found and found.group(1)

    def stop(self) -> str:
        self.proc.stdin.close()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)
        return self.stderr()


def _ask(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    body = response.read().decode("utf-8", "replace")
    conn.close()
    return response.status, body, response


def test_a_stranger_gets_no_page_and_prints_nothing_the_run_gets_every_page(other_user, tmp_path):
    driver = Driver(tmp_path)
    try:
        started = driver.started()
        addresses, port = started["addresses"], started["port"]
        quiet_since = time.monotonic()

        # -- the stranger ------------------------------------------------------------------------------------------
        done = run_as(other_user, [sys.executable, "-c", STRANGER_HTTP, str(port), json.dumps(ROUTES)], timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        pages = json.loads(done.stdout)
        knocked = run_as(other_user, [sys.executable, str(STRANGER), *addresses], timeout=240)
        assert knocked.returncode == 0, knocked.stderr[-3000:]
        time.sleep(2)  # what the knocks would print reaches the pipe
        printed = [line for line in driver.stderr(quiet_since).splitlines() if not any(n in line for n in LOAD_NOISE)]

        # -- the run's user, with the printed token ----------------------------------------------------------------
        token = driver.token(port) or "none-printed"
        first = _ask(port, f"/status?token={token}&theme=dark")
        cookie_header = first[2].getheader("Set-Cookie") or ""
        cookie = cookie_header.split(";")[0]
        with_cookie = {path: _ask(port, path, {"Cookie": cookie})[:2] for path in ROUTES if path != "/sitemap.json"}
        bearer = {"Authorization": f"Bearer {token}"}
        metrics = _ask(port, "/metrics", bearer)[:2]
        rollout = _ask(port, f"/uni-agent/api/rollout/{RUN}/{INSTANCE}/0.json", bearer)[:2]
        other_port_cookie = _ask(port, "/status", {"Cookie": f"uni-agent-token-{port + 1}={token}"})[0]
        # A page served on another port of 127.0.0.1, opened in the user's browser, sends the cookie along (cookies
        # and SameSite ignore ports) with its own Origin: bokeh's websocket must not open for it.
        websocket = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                     "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Cookie": cookie}
        cross_origin = _ask(port, "/status/ws", {**websocket, "Origin": f"http://127.0.0.1:{port + 1}"})[0]
        same_origin = _ask(port, "/status/ws", {**websocket, "Origin": f"http://127.0.0.1:{port}"})[0]
        token_file = driver.home / ".config" / "uni-agent" / "dashboard" / f"{os.uname().nodename}-{port}.token"
        file_mode = stat.S_IMODE(token_file.stat().st_mode) if token_file.exists() else None
        file_token = token_file.read_text() if token_file.exists() else None
        dir_mode = stat.S_IMODE(token_file.parent.stat().st_mode) if token_file.exists() else None
        run_log = "".join(p.read_text() for p in driver.log_dir.glob("driver-*.jsonl"))
    finally:
        driver.stop()

    # The stranger: 403 on every route, every way, with nothing of the run in the answer.
    got_in = {f"{path} [{way}]": [status, body[:100]] for path, ways in pages.items()
              for way, (status, body, cookie) in ways.items() if status != 403 or body != "403: Forbidden\n" or cookie}
    assert not got_in, json.dumps(got_in, indent=1)[:6000]
    assert HIDDEN not in done.stdout and token not in done.stdout
    # ...nor in through the cluster's ports (the TLS attempts, as test_cluster_security's)...
    report = json.loads(knocked.stdout)
    assert all(v.startswith("refused") for outcomes in report.values() for k, v in outcomes.items()
               if k != "port reachable"), json.dumps(report, indent=1)
    # ...and nothing of it on the run's terminal: no traceback for /sitemap.json, no TLS handshake warnings.
    assert printed == [], "\n".join(printed)[-6000:]
    # the refused handshakes went to the run's log instead
    assert "connection_refused" in {json.loads(line).get("event") for line in run_log.splitlines()}

    # The user: the printed link carries the token; the first visit sets the cookie and sends the browser to the
    # same address without the token.
    assert f"uni-agent page: http://127.0.0.1:{port}/uni-agent?token={token}\n" in driver.stderr()
    assert first[0] == 302 and first[2].getheader("Location") == "/status?theme=dark", first[:2]
    assert cookie == f"uni-agent-token-{port}={token}", cookie_header
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {p.strip() for p in cookie_header.split(";")}, cookie_header
    refused = {path: status for path, (status, _) in with_cookie.items() if status != 200}
    assert not refused, refused
    assert "Task Stream" in with_cookie["/status"][1] or "task-stream" in with_cookie["/status"][1].lower()
    assert HIDDEN in with_cookie[f"/uni-agent/api/rollout/{RUN}/{INSTANCE}/0.json"][1]
    assert metrics[0] == 200 and "uni_agent_rollouts" in metrics[1] and "dask_scheduler_workers" in metrics[1]
    assert rollout[0] == 200 and HIDDEN in rollout[1]
    assert other_port_cookie == 403  # another server's cookie name does not open this one
    assert cross_origin == 403 and same_origin != 403, (cross_origin, same_origin)
    # The token file for scrapers: the same token, the user's alone.
    assert (file_token, file_mode, dir_mode) == (token, 0o600, 0o700)
    assert not token_file.exists()  # removed with the scheduler


def test_the_dashboard_setting_off_serves_no_page(capsys):
    """`dashboard: false`: the LocalCluster's scheduler stops listening for HTTP (Dask starts a server even without
    a dashboard: its JSON, /info pages and /metrics), and the run prints no address."""
    from uni_agent.driver.cluster import cluster_client
    from uni_agent.settings import load_settings

    async def scenario():
        async with cluster_client(load_settings(local_workers=1, dashboard=False)) as client:
            port = client.cluster.scheduler.http_server.port
            return port, await asyncio.to_thread(_connect, port), await client.submit(sum, [1, 2])

    port, connected, works = asyncio.run(scenario())
    assert works == 3  # the run's cluster itself works
    assert connected.startswith("refused"), f"port {port}: {connected}"
    err = capsys.readouterr().err
    assert "dask dashboard and uni-agent page: off" in err and "token=" not in err and "http://" not in err, err


def _connect(port: int) -> str:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), 5).close()
        return "connected"
    except OSError as exc:
        return f"refused: {exc}"


def test_a_scheduler_started_apart_makes_the_token_the_driver_prints_it(tmp_path, capsys):
    """`dask scheduler --preload uni_agent.scheduler_preload` (the SLURM recipes' scheduler): the preload guards the
    pages from the scheduler's start and writes the token to ~/.config/uni-agent/dashboard/<host>-<port>.token, the
    user's alone; a driver that connects fetches it over the TLS comm and prints it in the links; the file goes with
    the scheduler."""
    from uni_agent.driver.cluster import cluster_client
    from uni_agent.driver.tls import write_credentials
    from uni_agent.settings import load_settings

    tls, home, scheduler_file = tmp_path / "tls", tmp_path / "home", tmp_path / "scheduler.json"
    write_credentials(tls)
    home.mkdir(mode=0o700)
    log = (tmp_path / "scheduler.log").open("wb")
    scheduler = subprocess.Popen(
        [str(Path(sys.executable).parent / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--protocol", "tls", "--tls-ca-file", str(tls / "ca.pem"),
         "--tls-cert", str(tls / "cert.pem"), "--tls-key", str(tls / "key.pem"), "--scheduler-file",
         str(scheduler_file), "--preload", "uni_agent.scheduler_preload"],
        env={**os.environ, "HOME": str(home)}, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not scheduler_file.exists():
            assert scheduler.poll() is None and time.monotonic() < deadline, (tmp_path / "scheduler.log").read_text()
            time.sleep(0.2)
        # Dask writes the scheduler file (not atomically) before it runs the preloads: wait for both.
        while True:
            with contextlib.suppress(ValueError):
                port = json.loads(scheduler_file.read_text())["services"]["dashboard"]
                break
            assert time.monotonic() < deadline, scheduler_file.read_text()
            time.sleep(0.2)
        token_file = home / ".config" / "uni-agent" / "dashboard" / f"{os.uname().nodename}-{port}.token"
        while not token_file.exists() and scheduler.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        written = token_file.read_text() if token_file.exists() else "no token file"
        mode = stat.S_IMODE(token_file.stat().st_mode) if token_file.exists() else None
        refused = {path: _ask(port, path)[0] for path in ("/uni-agent", "/status", "/metrics", "/sitemap.json")}
        scraped = _ask(port, "/metrics", {"Authorization": f"Bearer {written}"})

        async def driver():
            settings = load_settings(scheduler_file=str(scheduler_file), tls_dir=str(tls), worker_wait_timeout=0.1)
            async with cluster_client(settings):
                pass

        asyncio.run(driver())
    finally:
        scheduler.terminate()
        scheduler.wait(60)
        log.close()

    assert refused == dict.fromkeys(refused, 403), refused
    assert mode == 0o600 and scraped[0] == 200 and "dask_scheduler_workers" in scraped[1], (mode, scraped[:1])
    err = capsys.readouterr().err
    assert f"dask dashboard: http://127.0.0.1:{port}/status?token={written}\n" in err, err
    assert f"uni-agent page: http://127.0.0.1:{port}/uni-agent?token={written}\n" in err, err
    assert not token_file.exists()  # removed when the scheduler closed
    assert "Traceback" not in (tmp_path / "scheduler.log").read_text()  # /sitemap.json asked without the token


def test_refused_connections_reach_the_run_log_not_the_console_and_cannot_fill_it(tmp_path, capsys):
    """What Dask's TLS listener logs for each refused connection goes to the run's log, at most REFUSED_PER_MINUTE
    lines a minute (the rest counted in the next line written), never to the console; its other messages are left
    alone. Dask's own logger and console handler, as a run's processes have them."""
    import logging

    import structlog

    from uni_agent import logs

    tcp = logging.getLogger("distributed.comm.tcp")
    console = logging.StreamHandler(sys.stderr)
    tcp.addHandler(console)
    saved, saved_structlog = logs._configured, structlog.get_config()  # this process's, for the tests after this one
    # a fresh count and minute: an earlier test's refused connections (same process) must not use up this one's lines
    earlier = [f for f in tcp.filters if isinstance(f, logs.RefusedConnections)]
    for f in earlier:
        tcp.removeFilter(f)
    try:
        logs.configure_logging(tmp_path, "driver")
        for i in range(3 * logs.REFUSED_PER_MINUTE):
            tcp.warning("Listener on %r: TLS handshake failed with remote %r: %s", "tls://127.0.0.1:1",
                        f"tls://127.0.0.1:{40000 + i}", "[SSL: WRONG_VERSION_NUMBER] wrong version number")
        tcp.warning("Closing dangling stream in %s", "a real problem of the user's own")
    finally:
        tcp.removeHandler(console)
        for f in [f for f in tcp.filters if isinstance(f, logs.RefusedConnections)]:
            tcp.removeFilter(f)
        for f in earlier:
            tcp.addFilter(f)
        logs._configured = saved
        structlog.configure(**saved_structlog)
    err = capsys.readouterr().err
    assert "handshake" not in err and "a real problem of the user's own" in err, err
    refused = [json.loads(line) for line in (tmp_path / f"driver-{os.getpid()}.jsonl").read_text().splitlines()
               if '"connection_refused"' in line]
    assert len(refused) == logs.REFUSED_PER_MINUTE, len(refused)
    assert "tls://127.0.0.1:40000" in refused[0]["detail"] and refused[-1]["refused_so_far"] == logs.REFUSED_PER_MINUTE


# A scheduler constructed, not yet started: Dask's HTTP server listens from the constructor on, its preloads run at
# the start (after its comm listener and services). Prints the status of /health asked in between, then that of
# /health asked once the scheduler's plugins have closed, as its close does before it stops the HTTP server.
BEFORE_THE_PRELOADS = """
import asyncio, sys
from distributed import Scheduler
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

async def status(url):
    try:
        return (await AsyncHTTPClient().fetch(url)).code
    except HTTPClientError as exc:
        return exc.code

async def main():
    scheduler = Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0", preload=sys.argv[1:])
    url = f"http://127.0.0.1:{scheduler.http_server.port}/health"
    try:
        print(await status(url))
        await scheduler  # started: the preloads have run
        # Dask's close runs the plugins' close before it stops the HTTP server: the pages asked in between
        for plugin in list(scheduler.plugins.values()):
            await plugin.close()
        print(await status(url))
    finally:
        await scheduler.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("preload, expected", [(["uni_agent.scheduler_preload"], "403\n403"), ([], "200\n200")],
                         ids=["with-the-preload", "plain-dask"])
def test_the_pages_are_refused_from_the_http_servers_start_not_from_the_preloads(tmp_path, preload, expected):
    """The preload's guard goes in as the scheduler's HTTP server starts and stays until the server stops: a
    stranger polling the port while the scheduler starts, or while it closes, gets no page (plain Dask, the
    control, answers at both moments)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    done = subprocess.run([sys.executable, "-c", BEFORE_THE_PRELOADS, *preload], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HOME": str(home)})
    assert done.stdout.strip() == expected, (done.stdout, done.stderr[-2000:])
