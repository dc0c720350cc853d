import atexit
import contextlib
import os
import tempfile
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _remove_if_empty(path: str, creator: int) -> None:
    if os.getpid() == creator:  # not in a forked child, while the session still uses it
        with contextlib.suppress(OSError):
            os.rmdir(path)


# Sandboxes of this test session live in their own root (inherited by the Dask workers the tests start), so the
# leak checks below see only this session's sandboxes even when another run shares the machine. Made only where
# none is given, and removed at exit when empty: sessions leave nothing behind in a shared /tmp.
if "UNI_AGENT_SANDBOX_ROOT" not in os.environ:
    os.environ["UNI_AGENT_SANDBOX_ROOT"] = tempfile.mkdtemp(prefix="uni-agent-test-sandboxes-")
    atexit.register(_remove_if_empty, os.environ["UNI_AGENT_SANDBOX_ROOT"], os.getpid())
AGENT_CONFIG = REPO_ROOT / "examples" / "agent_interaction" / "agent_config_local.yaml"
# What a local sandbox runs on the host: its bwrap (the supervisor and the commands run inside it).
SANDBOX_PROCESSES = ("bwrap",)
# A worker's fork server (uni_agent/sandbox/fork_server.py): it lives as long as its worker.
FORK_SERVER_MARK = "uni-agent-fork-server"


@pytest.fixture(scope="session")
def dask_client(tmp_path_factory):
    """One real LocalCluster (worker processes) for the session's integration tests."""
    from distributed import Client, LocalCluster

    from uni_agent.private_dirs import dask_dir

    os.environ.setdefault("UNI_AGENT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address=":0", resources={"SANDBOX": 64},
                      local_directory=str(dask_dir())) as cluster, Client(cluster) as client:
        yield client


@pytest.fixture(autouse=True)
def no_leftover_sandboxes(tmp_path_factory):
    """After every test: no sandbox dir, mount or bwrap process of this session is left behind.

    Sandboxes of this session live under its sandbox root or, for tests that point the root elsewhere, under
    pytest's base temp dir; processes of other test runs on the machine are not counted. Sandboxes close in worker
    processes too, so it allows a few seconds for them to finish before failing the test."""
    from uni_agent.sandbox.local import sandbox_root

    root = sandbox_root()
    markers = (str(root), str(tmp_path_factory.getbasetemp()))
    before = set(root.iterdir())
    yield

    def leftovers() -> list[str]:
        dirs = [str(p) for p in set(root.iterdir()) - before]
        mounts = [line for line in Path("/proc/self/mounts").read_text().splitlines()
                  if any(m in line for m in markers)]
        processes = [cmd for cmd in map(_cmd, Path("/proc").glob("[0-9]*"))
                     if cmd.startswith(SANDBOX_PROCESSES) and any(m in cmd for m in markers)
                     and FORK_SERVER_MARK not in cmd]
        return dirs + mounts + processes + _sandboxes_in_fork_servers(markers)

    deadline = time.monotonic() + 15
    while (found := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not found, f"left behind by this test: {found}"


@pytest.fixture(scope="session")
def rows(tmp_path_factory):
    """Every bundled task as a dataset row in the seed schema."""
    from uni_agent.driver.dataset import read_rows
    from uni_agent.tasks.swe_form import convert

    path = tmp_path_factory.mktemp("data") / "bundled.parquet"
    convert(None, path)
    return read_rows(path)


def assistant_turns(body) -> int:
    """How many replies the model already gave in a chat request (for ScriptedLLM policies)."""
    return sum(m["role"] == "assistant" for m in body["messages"])


def poll_until(predicate, timeout: float, what: str):
    """The predicate's first truthy value, polled every 0.1 s; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.1)
    return value


def _sandboxes_in_fork_servers(markers: tuple[str, ...]) -> list[str]:
    """Sandboxes still running in a fork server of this session: the fork server (bwrap, its init, the fork server's
    Python) stays with its worker process; each sandbox is a child of the fork server's Python."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(proc.name))
            commands[int(proc.name)] = _cmd(proc)
    left = []
    for pid, cmd in commands.items():
        if cmd.startswith("bwrap") and FORK_SERVER_MARK in cmd and any(m in cmd for m in markers):
            for init in children.get(pid, []):
                for fork_server in children.get(init, []):
                    left += [f"a sandbox of fork server {fork_server}: pid {child}"
                             for child in children.get(fork_server, [])]
    return left


def _cmd(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def scripted_run_inputs(where: Path, **agent_fields) -> tuple[Path, Path]:
    """The bundled tasks as rows and the default agent config with API tool calls (what a ScriptedLLM answers), in
    `where`, readable by every user (other users' runs read them). `agent_fields` set top-level agent fields."""
    import yaml

    from uni_agent.tasks.swe_form import convert

    data = where / "rows.parquet"
    convert(None, data)
    agents = yaml.safe_load(AGENT_CONFIG.read_text())
    for agent in agents:
        agent.setdefault("interaction", {}).update(tools_in="api", constrain_tool_calls=False, max_turns=5)
        agent.update(agent_fields)
    config = where / "agents.yaml"
    config.write_text(yaml.safe_dump(agents))
    for path in (data, config):
        path.chmod(0o644)
    return data, config
