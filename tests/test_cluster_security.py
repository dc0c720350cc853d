"""The run's cluster authenticates: a real LocalCluster (worker processes) started by the driver's cluster_client speaks
TLS with credentials only its own processes hold, so a client without them (plain tcp, TLS without a certificate, TLS
with credentials of its own) gets nothing, neither from the scheduler nor from a worker or nanny, while the run's own
tasks and actors work, and its pages answer only with the run's token (tests/test_security_pages.py has the rest).
Also as another, unprivileged user (created here when running as root; skipped otherwise): that user cannot reach
root's run's cluster, and root's attempts on that user's run's cluster are refused the same way.
The credentials files for clusters started apart: private, refused when not, a warning for tcp://.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from stranger import attempts, got_in, identity
from unprivileged import ensure_user, popen_as, remove_users, run_as
from uni_agent.dashboard import page_token
from uni_agent.driver import tls
from uni_agent.driver.cluster import cluster_client
from uni_agent.settings import load_settings

STRANGER = Path(__file__).parent / "stranger.py"
OTHER_USER = "ua-sec-other"


class Tally:
    """An actor: the run's agent workers are actors, so they must work over TLS too."""

    def __init__(self) -> None:
        self.total = 0

    def add(self, n: int) -> int:
        self.total += n
        return self.total


def _get(url: str, token: str | None = None) -> str:
    """The page's text; for a refused request "HTTP <status>"."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.read().decode()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"


async def _addresses(client) -> dict[str, str]:
    info = await client.scheduler.identity(n_workers=-1)
    worker, about = next(iter(info["workers"].items()))
    return {"scheduler": client.scheduler.address, "worker": worker, "nanny": about["nanny"]}


def test_the_runs_cluster_takes_only_its_own_credentials():
    async def scenario():
        async with cluster_client(load_settings(local_workers=1)) as client:
            where = await _addresses(client)
            assert all(a.startswith("tls://127.0.0.1:") for a in where.values()), where
            assert client.dashboard_link.startswith("http://127.0.0.1:"), client.dashboard_link

            # The run's own work goes over TLS: a task in a worker process, an actor, a scheduler plugin.
            assert await client.submit(os.getpid, pure=False) != os.getpid()
            tally = await client.submit(Tally, actor=True)
            assert [await tally.add(2), await tally.add(3)] == [2, 5]
            from uni_agent.dashboard.plugin import UniAgentDashboard
            from uni_agent.events import TOPIC, rollout_event

            await client.register_plugin(UniAgentDashboard())
            await client.log_event(TOPIC, rollout_event("run-tls", "task-tls", 0, "running", worker=where["worker"]))

            # The probe itself works: with the run's credentials each address answers.
            own = client.security.get_connection_args("client")
            for address in where.values():
                assert (await identity(address, **own))["type"] in ("Scheduler", "Worker", "Nanny")
            report = {address: await attempts(address) for address in where.values()}

            base = client.dashboard_link.removesuffix("/status")
            token = await client.run_on_scheduler(page_token)  # what the run prints in the link
            paths = ("/json/identity.json", "/uni-agent/api/state.json?run=run-tls")
            without_token = {path: await asyncio.to_thread(_get, base + path) for path in paths}
            pages = {}
            for _ in range(100):  # the event reaches the plugin soon after log_event returns
                pages = {path: await asyncio.to_thread(_get, base + path, token) for path in paths}
                if "task-tls" in pages["/uni-agent/api/state.json?run=run-tls"]:
                    break
                await asyncio.sleep(0.1)
            key = client.security.tls_client_key
            seen_by_workers = await client.run(
                lambda: open("/proc/self/cmdline", "rb").read() + open("/proc/self/environ", "rb").read())
            return report, pages, key, seen_by_workers, without_token

    report, pages, key, seen_by_workers, without_token = asyncio.run(scenario())
    assert not got_in(report), json.dumps(report, indent=1)
    assert without_token == {path: "HTTP 403" for path in pages}, without_token  # the pages need the run's token

    # What the pages serve: addresses (no key without credentials), never the credentials themselves.
    assert "task-tls" in pages["/uni-agent/api/state.json?run=run-tls"]  # the page did get the run's state
    key_line = key.splitlines()[2]  # a line of the key's body
    for path, text in pages.items():
        assert "PRIVATE KEY" not in text and "CERTIFICATE" not in text and key_line not in text, path
    assert '"address": "tls://127.0.0.1:' in pages["/json/identity.json"]
    # The key reaches the worker processes by pipe, not by command line or environment (readable in /proc).
    for seen in seen_by_workers.values():
        assert b"PRIVATE KEY" not in seen and key_line.encode() not in seen


@pytest.fixture
def other_user():
    user = ensure_user(OTHER_USER)  # skips with the reason where users cannot be created (not root)
    yield user
    remove_users([OTHER_USER])


def _metrics_answer(port: int) -> str:
    """What http://127.0.0.1:PORT/metrics answers: "refused" when nothing listens there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return "refused" if isinstance(exc.reason, ConnectionRefusedError) else f"error {exc.reason}"


def test_the_runs_workers_serve_no_pages():
    """Dask starts an HTTP server in every worker (/metrics, /health, /sitemap.json) that answers any user of the
    node; the worker preload closes it. A plain Dask worker's server answers, so the probe can tell."""
    async def ports(client) -> list[int]:
        return list((await client.run(lambda dask_worker: dask_worker.http_server.port)).values())

    async def runs_and_plain() -> tuple[list[str], list[str]]:
        async with cluster_client(load_settings(local_workers=2)) as client:
            ours = [await asyncio.to_thread(_metrics_answer, port) for port in await ports(client)]
        from distributed import Client, LocalCluster
        async with LocalCluster(n_workers=1, processes=False, dashboard_address=None, asynchronous=True) as plain, \
                Client(plain, asynchronous=True) as client:
            theirs = [await asyncio.to_thread(_metrics_answer, port) for port in await ports(client)]
        return ours, theirs

    ours, plain = asyncio.run(runs_and_plain())
    assert ours == ["refused", "refused"], ours
    assert plain == ["HTTP 200"], plain


def test_another_user_cannot_reach_the_runs_cluster_nor_root_theirs(other_user):
    async def root_runs():
        async with cluster_client(load_settings(local_workers=1)) as client:
            where = await _addresses(client)
            done = await asyncio.to_thread(run_as, other_user, [sys.executable, str(STRANGER), *where.values()],
                                           timeout=240)
            assert done.returncode == 0, done.stderr[-3000:]
            return json.loads(done.stdout)

    report = asyncio.run(root_runs())
    assert len(report) == 3 and not got_in(report), json.dumps(report, indent=1)

    # The other user's run, with root as the stranger.
    serve = ("import asyncio, json, os, sys\n"
             "from uni_agent.settings import load_settings\n"
             "from uni_agent.driver.cluster import cluster_client\n"
             "async def main():\n"
             "    async with cluster_client(load_settings(local_workers=1)) as c:\n"
             "        info = await c.scheduler.identity(n_workers=-1)\n"
             "        uid = await c.submit(os.getuid, pure=False)\n"
             "        where = [c.scheduler.address, *info['workers']]\n"
             "        print(json.dumps({'addresses': where, 'uid': uid}), flush=True)\n"
             "        await asyncio.to_thread(sys.stdin.read)\n"
             "asyncio.run(main())\n")
    theirs = popen_as(other_user, [sys.executable, "-c", serve])
    try:
        line = theirs.stdout.readline()
        assert line, theirs.stderr.read()[-3000:] if theirs.poll() is not None else "no address from the other run"
        started = json.loads(line)
        assert started["uid"] == other_user.uid  # their run works, as them
        report = asyncio.run(_attempt_all(started["addresses"]))
        assert not got_in(report), json.dumps(report, indent=1)
    finally:
        theirs.stdin.close()
        try:
            theirs.wait(120)
        except Exception:
            theirs.kill()
            theirs.wait()


async def _attempt_all(addresses: list[str]) -> dict[str, dict[str, str]]:
    return {address: await attempts(address) for address in addresses}


def test_credentials_files_are_private_and_checked(tmp_path, capsys, monkeypatch):
    where = tmp_path / "creds"
    assert tls.write_credentials(where) is True
    assert oct(where.stat().st_mode & 0o777) == "0o700"
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in where.iterdir()} == {
        "ca.pem": "0o600", "cert.pem": "0o600", "key.pem": "0o600"}
    key = (where / "key.pem").read_bytes()
    assert tls.write_credentials(where) is False and (where / "key.pem").read_bytes() == key  # valid: kept
    assert tls.write_credentials(where, force=True) is True and (where / "key.pem").read_bytes() != key
    security = tls.file_security(where)
    assert security.require_encryption and security.tls_client_key == str(where / "key.pem")

    (where / "key.pem").chmod(0o640)
    with pytest.raises(tls.CredentialsError, match=r"key.pem is mode 640: others could read"):
        tls.file_security(where)
    (where / "key.pem").chmod(0o600)
    where.chmod(0o750)
    with pytest.raises(tls.CredentialsError, match=r"creds is mode 750"):
        tls.file_security(where)
    where.chmod(0o700)
    (tmp_path / "link").symlink_to(where)
    with pytest.raises(tls.CredentialsError, match="not a symlink"):
        tls.file_security(tmp_path / "link")
    with pytest.raises(tls.CredentialsError, match=r"no TLS credentials at .*missing.*uni-agent tls init"):
        tls.file_security(tmp_path / "missing")

    later = tls._now() + __import__("datetime").timedelta(days=400)
    monkeypatch.setattr(tls, "_now", lambda: later)
    with pytest.raises(tls.CredentialsError, match=r"cert.pem expired on .* tls init --force"):
        tls.file_security(where)
    assert tls.write_credentials(where) is True  # init renews what has expired
    monkeypatch.undo()

    assert tls.client_security("tcp://10.0.0.1:8786", None) is None
    assert "WARNING: the scheduler tcp://10.0.0.1:8786 is not authenticated" in capsys.readouterr().err
    assert tls.client_security("tls://10.0.0.1:8786", str(where)).tls_ca_file == str(where / "ca.pem")


def test_credentials_owned_by_someone_else_are_refused(other_user, tmp_path):
    where = tmp_path / "theirs"
    tls.write_credentials(where)
    os.chown(where, other_user.uid, other_user.gid)
    with pytest.raises(tls.CredentialsError, match=rf"belongs to uid {other_user.uid}, not to you"):
        tls.file_security(where)
    with pytest.raises(tls.CredentialsError, match=rf"belongs to uid {other_user.uid}"):
        tls.write_credentials(where)  # nor written into


def test_tls_init_command(tmp_path):
    import subprocess

    target = tmp_path / "a" / "tls"
    done = subprocess.run([sys.executable, "-m", "uni_agent.cli", "tls", "init", str(target)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"wrote TLS credentials in {target}" in done.stdout
    assert f"--tls-key {target / 'key.pem'}" in done.stdout
    again = subprocess.run([sys.executable, "-m", "uni_agent.cli", "tls", "init", "--quiet", str(target)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout == ""
