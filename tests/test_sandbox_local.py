"""The local bubblewrap sandbox, for real: exec semantics, timeouts, output caps, copy-on-write, isolation, cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import select
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import _cmd, poll_until

from uni_agent.sandbox import ExecResult, Sandbox, SandboxError, SandboxStartError, read_file, write_file
from uni_agent.sandbox.bwrap import _python_dirs
from uni_agent.sandbox.local import CAPTURE_LIMIT_BYTES, LocalDeploymentConfig, LocalSandbox
from uni_agent.sandbox.userns import user_namespace

T = TypeVar("T")
REPO_FILES = {
    "a.txt": b"original a\n",
    "b.txt": b"original b\n",
    "sub/c.py": b"VALUE = 1\n",
}


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UNI_AGENT_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("UNI_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    repo = tmp_path / "repo"
    for rel, data in REPO_FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    return repo


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


@contextlib.asynccontextmanager
async def sandbox(repo: Path, env: dict[str, str] | None = None, name: str = "t", **config: Any
                  ) -> AsyncIterator[LocalSandbox]:
    box = LocalDeploymentConfig(repo=str(repo), **config).build(env or {}, name)
    assert isinstance(box, LocalSandbox)
    assert isinstance(box, Sandbox)
    await box.start()
    try:
        yield box
    finally:
        await box.close()


def with_sandbox(repo: Path, body: Callable[[LocalSandbox], Awaitable[T]], **kwargs: Any) -> T:
    async def main() -> T:
        async with sandbox(repo, **kwargs) as box:
            return await body(box)

    return run(main())


def processes_with(marker: bytes) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry))
    return pids


def wait_until_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait (on pidfds, not by sleeping) for each process to exit; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    alive = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                alive.append(pid)
        finally:
            os.close(fd)
    return alive


def mount_lines(fragment: str) -> list[str]:
    return [line for line in Path("/proc/self/mounts").read_text().splitlines() if fragment in line]


# -- exec basics ---------------------------------------------------------------------------------------------------


def test_exec_output_and_exit_code(repo: Path) -> None:
    async def body(box: LocalSandbox) -> None:
        ok = await box.exec("pwd; cat a.txt", 10)
        assert ok == ExecResult(b"/testbed\noriginal a\n", b"", 0, False, ok.duration_s, 0)
        assert ok.output == "/testbed\noriginal a\n"
        failed = await box.exec("echo partial; exit 7", 10)
        assert (failed.stdout, failed.exit_code, failed.timed_out) == (b"partial\n", 7, False)
        missing = await box.exec("no-such-command-xyz", 10)
        assert missing.exit_code == 127
        assert b"no-such-command-xyz" in missing.stdout

    with_sandbox(repo, body)


def test_stderr_merged_by_default_and_separate_on_request(repo: Path) -> None:
    async def body(box: LocalSandbox) -> None:
        merged = await box.exec("echo out; echo err >&2; echo out2", 10)
        assert merged.stdout == b"out\nerr\nout2\n"
        assert merged.stderr == b""
        separate = await box.exec("echo out; echo err >&2; echo out2", 10, merge_stderr=False)
        assert separate.stdout == b"out\nout2\n"
        assert separate.stderr == b"err\n"
        assert separate.output == "out\nout2\nerr\n"
        # The switch is per call: the next default call merges again.
        again = await box.exec("echo err >&2", 10)
        assert (again.stdout, again.stderr) == (b"err\n", b"")

    with_sandbox(repo, body)


def test_stdin_is_passed_and_absent_stdin_is_empty(repo: Path) -> None:
    async def body(box: LocalSandbox) -> None:
        piped = await box.exec("tr a-z A-Z", 10, stdin=b"hello\n")
        assert piped.stdout == b"HELLO\n"
        empty = await box.exec("cat; echo end", 10)
        assert empty.stdout == b"end\n"

    with_sandbox(repo, body)


def test_cwd_and_exports_persist_across_calls_exit_and_syntax_errors(repo: Path) -> None:
    async def body(box: LocalSandbox) -> None:
        first = await box.exec("cd sub && export FOO='two words' && LOCAL_ONLY=1", 10)
        assert first.exit_code == 0
        seen = await box.exec('pwd; echo "$FOO"; echo "[${LOCAL_ONLY-}]"', 10)
        assert seen.stdout == b"/testbed/sub\ntwo words\n[]\n"

        exited = await box.exec("cd /tmp; export FOO=after-exit BAR=2; exit 3", 10)
        assert exited.exit_code == 3
        seen = await box.exec('pwd; echo "$FOO $BAR"', 10)
        assert seen.stdout == b"/tmp\nafter-exit 2\n"

        broken = await box.exec("if then fi (", 10)
        assert broken.exit_code not in (0, None)
        assert b"syntax error" in broken.stdout
        seen = await box.exec('pwd; echo "$FOO $BAR"', 10)
        assert (seen.stdout, seen.exit_code) == (b"/tmp\nafter-exit 2\n", 0)

        unset = await box.exec("unset BAR; cd /testbed", 10)
        assert unset.exit_code == 0
        seen = await box.exec('pwd; echo "[${BAR-unset}]"', 10)
        assert seen.stdout == b"/testbed\n[unset]\n"

    with_sandbox(repo, body)


# -- timeouts and output limits ------------------------------------------------------------------------------------


def test_timeout_kills_the_command_and_what_it_started_but_not_what_it_detached(repo: Path) -> None:
    """A timeout kills the command's process group; a process it detached (`setsid`) keeps running, as on a real
    machine, until the sandbox closes."""
    token = f"{uuid.uuid4().int % 10_000}"
    foreground = f"29.{token}1"
    detached = f"31.{token}7"
    background = f"33.{token}3"
    command = f"(setsid sleep {detached} >/dev/null 2>&1 &); sleep {background} & sleep {foreground}"

    async def body(box: LocalSandbox) -> None:
        started = time.monotonic()
        result = await box.exec(command, 1)
        elapsed = time.monotonic() - started
        assert result.timed_out is True
        assert result.exit_code is None
        assert elapsed < 10
        assert 0.9 <= result.duration_s < 10
        # The command's own group (the foreground sleep and its `&` sibling) is killed.
        assert wait_until_gone(processes_with(f"sleep\0{foreground}".encode()), timeout=5) == []
        assert wait_until_gone(processes_with(f"sleep\0{background}".encode()), timeout=5) == []
        # The detached one is in a session of its own: it lives on.
        assert len(processes_with(f"sleep\0{detached}".encode())) == 1
        # The sandbox still works after a timeout.
        after = await box.exec("echo alive", 10)
        assert (after.stdout, after.exit_code, after.timed_out) == (b"alive\n", 0, False)

    with_sandbox(repo, body)
    # ... until the sandbox closes: its pid namespace takes every process with it.
    assert wait_until_gone(processes_with(f"sleep\0{detached}".encode()), timeout=5) == []


def test_runtime_timeout_caps_the_requested_timeout(repo: Path) -> None:
    async def body(box: LocalSandbox) -> None:
        started = time.monotonic()
        result = await box.exec("sleep 20", 300)
        assert result.timed_out is True
        assert time.monotonic() - started < 10

    with_sandbox(repo, body, runtime_timeout=1)


def test_huge_output_is_capped_and_counted(repo: Path) -> None:
    total = 20_000_000

    async def body(box: LocalSandbox) -> None:
        result = await box.exec(f"head -c {total} /dev/zero | tr '\\0' a", 60)
        assert result.exit_code == 0
        assert len(result.stdout) == CAPTURE_LIMIT_BYTES
        assert set(result.stdout) == {ord("a")}
        assert result.truncated_bytes == total - CAPTURE_LIMIT_BYTES
        # stderr has its own cap; both are counted.
        both = await box.exec(f"head -c {total} /dev/zero >&2; head -c 10 /dev/zero", 60, merge_stderr=False)
        assert len(both.stdout) == 10
        assert len(both.stderr) == CAPTURE_LIMIT_BYTES
        assert both.truncated_bytes == total - CAPTURE_LIMIT_BYTES

    with_sandbox(repo, body)


def test_binary_output_decodes_safely(repo: Path) -> None:
    async def body(box: LocalSandbox) -> None:
        result = await box.exec(r"printf '\xff\xfe\x00abc\xc3'", 10)
        assert result.stdout == b"\xff\xfe\x00abc\xc3"
        text = result.output
        assert isinstance(text, str)
        assert "abc" in text and "\ufffd" in text and "\x00" in text
        stderr_binary = await box.exec(r"printf '\x80\x81' >&2", 10, merge_stderr=False)
        assert stderr_binary.stderr == b"\x80\x81"
        assert stderr_binary.output == "\ufffd\ufffd"

    with_sandbox(repo, body)


# -- copy-on-write workspace ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("workspace", ["auto", "copy"])
def test_workspace_is_copy_on_write(repo: Path, tmp_path: Path, workspace: str) -> None:
    before = tree(repo)
    assert before == REPO_FILES

    async def main() -> None:
        async with sandbox(repo, name="one", workspace=workspace) as one, \
                sandbox(repo, name="two", workspace=workspace) as two:
            # an overlay as root, and without root in a user namespace (copies only where the kernel refuses both)
            assert one.use_overlay is (workspace == "auto" and (os.geteuid() == 0 or user_namespace() is not None))
            changed = await one.exec(
                "echo changed > a.txt && rm b.txt && echo new > new.txt && mkdir -p d/e && echo x > d/e/f && "
                "echo more >> sub/c.py", 10)
            assert changed.exit_code == 0
            seen = await one.exec("cat a.txt new.txt d/e/f sub/c.py; test -e b.txt || echo b-gone", 10)
            assert seen.stdout == b"changed\nnew\nx\nVALUE = 1\nmore\nb-gone\n"
            # The other sandbox on the same repo sees the original files only.
            other = await two.exec("cat a.txt b.txt sub/c.py; ls", 10)
            assert other.stdout == b"original a\noriginal b\nVALUE = 1\na.txt\nb.txt\nsub\n"
            # And its own change is invisible to the first.
            assert (await two.exec("echo mine > only-two.txt", 10)).exit_code == 0
            assert (await one.exec("test -e only-two.txt", 10)).exit_code == 1
            # The git snapshot works inside and shows exactly this sandbox's changes.
            status = await one.exec("git status --porcelain", 10, merge_stderr=False)
            assert status.exit_code == 0, status.stderr
            assert sorted(status.stdout.decode().splitlines()) == [
                " D b.txt", " M a.txt", " M sub/c.py", "?? d/", "?? new.txt"]
        # Neither the source repo nor the shared snapshot in the cache changed.
        assert tree(repo) == before
        snapshots = [p for p in (tmp_path / "cache" / "repos").iterdir() if not p.name.startswith(".")]
        assert len(snapshots) == 1
        assert tree(snapshots[0]) == before

    run(main())


def test_changed_source_repo_gets_a_new_snapshot(repo: Path) -> None:
    async def read_a(box: LocalSandbox) -> bytes:
        return (await box.exec("cat a.txt", 10)).stdout

    assert with_sandbox(repo, read_a) == b"original a\n"
    (repo / "a.txt").write_bytes(b"edited on the host, longer\n")
    assert with_sandbox(repo, read_a) == b"edited on the host, longer\n"


# -- isolation -----------------------------------------------------------------------------------------------------


def net_interfaces(proc_net_dev: str) -> set[str]:
    return {line.split(":")[0].strip() for line in proc_net_dev.splitlines()[2:] if ":" in line}


def test_no_network(repo: Path) -> None:
    connect = ("import socket; s = socket.socket(); s.settimeout(3); s.connect(('1.1.1.1', 53)); print('connected')")

    async def body(box: LocalSandbox) -> None:
        interfaces = await box.exec("cat /proc/net/dev", 10)
        assert interfaces.exit_code == 0
        assert net_interfaces(interfaces.output) == {"lo"}
        sock = await box.exec(f'python -c "{connect}"', 10)
        assert sock.exit_code != 0
        assert b"connected" not in sock.stdout
        assert (await box.exec("getent hosts pypi.org", 10)).exit_code != 0

    with_sandbox(repo, body)


def test_network_true_shares_the_host_network(repo: Path) -> None:
    async def body(box: LocalSandbox) -> str:
        return (await box.exec("cat /proc/net/dev", 10)).output

    inside = net_interfaces(with_sandbox(repo, body, network=True))
    assert inside == net_interfaces(Path("/proc/net/dev").read_text())


def test_environment_is_cleared_and_given_variables_are_set(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNI_AGENT_SECRET_PROBE", "leak-me-4242")

    async def body(box: LocalSandbox) -> None:
        env = await box.exec("env", 10)
        assert env.exit_code == 0
        assert b"leak-me-4242" not in env.stdout
        assert b"UNI_AGENT_SECRET_PROBE" not in env.stdout
        probe = await box.exec('echo "[${UNI_AGENT_SECRET_PROBE-unset}] [$MY_VAR] [$PAGER] [$HOME]"', 10)
        assert probe.stdout == b"[unset] [hello world] [cat] [/root]\n"
        assert b"UA_MERGE_STDERR" not in env.stdout

    with_sandbox(repo, body, env={"MY_VAR": "hello world", "PAGER": "cat"})


def test_host_files_outside_the_sandbox_are_not_visible(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret\n")
    # Root's home can be listed only by root; an ordinary user checks that their own home is hidden instead.
    host_root = set(os.listdir("/root")) if os.access("/root", os.R_OK | os.X_OK) else None
    host_home = Path.home()
    # /root inside is the sandbox's own home; only the mount points of the Python install (when it lives under
    # /root, as with pyenv) appear in it.
    python_under_root = python_mounts_under(Path("/root"))

    async def body(box: LocalSandbox) -> None:
        secret = await box.exec(f"cat {outside / 'secret.txt'}", 10)
        assert secret.exit_code != 0
        assert b"host secret" not in secret.stdout
        assert (await box.exec(f"test -e {repo}", 10)).exit_code == 1
        listing = await box.exec("ls -A /root", 10)
        assert set(listing.output.split()) == python_under_root
        assert (await box.exec("touch /root/mine && ls -A /root", 10)).output.split().count("mine") == 1
        if host_root is not None:
            assert set(os.listdir("/root")) == host_root  # the sandbox's home is not the host's /root
        if host_home != Path("/root"):  # the caller's own home shows at most the way to a venv kept in it
            if python_under_home := python_mounts_under(host_home):
                assert set((await box.exec(f"ls -A {host_home}", 10)).output.split()) == python_under_home
            else:
                assert (await box.exec(f"test -e {host_home}", 10)).exit_code == 1
        assert box.dir is not None and (box.dir / "home" / "mine").exists()

    with_sandbox(repo, body)


def python_mounts_under(directory: Path) -> set[str]:
    """The entries of `directory` the sandbox shows: the first step towards each Python dir mounted below it."""
    return {Path(d).relative_to(directory).parts[0] for d in _python_dirs() if Path(d).is_relative_to(directory)
            and Path(d) != directory}


def test_installed_package_with_the_hidden_tests_is_not_visible(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed without -e, uni_agent lives in the venv the sandbox mounts for `python`, and its bundled tasks
    hold tests and solutions: the sandbox shows an empty directory there. (Here the repository is mounted as if
    it were a Python dir, which is what a non-editable install amounts to.)"""
    from uni_agent.sandbox import bwrap, local

    repo_root = str(Path(bwrap.PACKAGE_DIR).parent)
    monkeypatch.setattr(bwrap, "_python_dirs", lambda: [repo_root])
    bundled = Path(local.BUNDLED_TASKS_DIR)
    assert any(bundled.iterdir())

    async def body(box: LocalSandbox) -> tuple[str, str]:
        package = await box.exec(f"ls -A {bwrap.PACKAGE_DIR}", 10)
        beside = await box.exec(f"ls {repo_root}", 10)
        return package.output, beside.output

    package, beside = with_sandbox(repo, body)
    assert package == "", package
    assert "uni_agent" in beside.split()  # the mount itself worked: only the package is masked


def test_only_workspace_tmp_and_home_are_writable(repo: Path) -> None:
    async def body(box: LocalSandbox) -> None:
        for path in ("/usr/ua-probe", "/etc/ua-probe", "/usr/bin/ua-probe", f"{_python_dirs()[0]}/ua-probe"):
            result = await box.exec(f"touch {path}", 10)
            assert result.exit_code != 0, path
            assert b"Read-only file system" in result.stdout or b"Permission denied" in result.stdout, result.stdout
            assert not os.path.exists(path), path
        # The sandbox's / is bwrap's own tmpfs: a write there never reaches the host; it lasts as long as the sandbox.
        assert (await box.exec("touch /ua-probe", 10)).exit_code == 0
        assert not os.path.exists("/ua-probe")
        assert (await box.exec("test -e /ua-probe", 10)).exit_code == 0
        for path in ("/testbed/w", "/tmp/w", "/root/w"):
            assert (await box.exec(f"touch {path}", 10)).exit_code == 0, path
        assert box.dir is not None and (box.dir / "tmp" / "w").exists()

    with_sandbox(repo, body)


def test_memory_limit_applies(repo: Path) -> None:
    allocate = "python -c \"x = bytearray(600 * 1024 * 1024); print('allocated')\""

    async def body(box: LocalSandbox) -> int | None:
        result = await box.exec(allocate, 30)
        return result.exit_code if b"allocated" not in result.stdout else 0

    assert with_sandbox(repo, body, max_memory_mb=256) != 0
    assert with_sandbox(repo, body, max_memory_mb=None) == 0


def test_fork_bomb_is_contained_and_the_sandbox_stays_usable(repo: Path) -> None:
    """A fork bomb hits the sandbox's process cap, is killed at the command timeout, and leaves the host, the
    sandbox and its cgroup in order. As root the cap must be a pids cgroup (`ulimit -u` does not bind root); an
    ordinary user, who cannot write one, gets `ulimit -u`, which binds them."""
    bomb = "bomb() { bomb | bomb & }; bomb; sleep 60"

    async def body(box: LocalSandbox) -> Path | None:
        if os.geteuid() == 0:
            assert box.process_limit.mode == "cgroup", "no writable pids cgroup: the fork bomb would not be contained"
        else:
            assert box.process_limit.mode in ("cgroup", "ulimit"), box.process_limit.mode
        started = time.monotonic()
        result = await box.exec(bomb, 5)
        assert result.timed_out and time.monotonic() - started < 30
        if box.process_limit.mode == "cgroup":
            peak = box.process_limit.peak()
            assert peak is not None and 40 <= peak <= 48, peak  # it did fork up to the cap, and not past it
        assert b"Resource temporarily unavailable" in result.stdout
        # The timeout killed every process of the bomb: only the sandbox's own processes are left (bwrap and its
        # init, the supervisor, and at most one shell waiting for the next command).
        await asyncio.to_thread(poll_until, lambda: only_the_sandbox_itself(sandbox_processes(box)), 10,
                                "the bomb to die")
        # The host (this process) can still start processes, and so can the sandbox.
        assert (await asyncio.create_subprocess_exec("true")).pid > 0
        after = await box.exec("echo alive", 10)
        assert after.exit_code == 0 and after.stdout == b"alive\n"
        cgroup = box.process_limit.cgroup
        assert cgroup is None or cgroup.exists()
        return cgroup

    cgroup = with_sandbox(repo, body, pids_limit=48)
    assert cgroup is None or not cgroup.exists(), "the sandbox's cgroup outlived it"


def sandbox_processes(box: LocalSandbox) -> list[int]:
    """The sandbox's processes: its cgroup's, or without one the process chain it started and all it forked (in the
    fork server: everything below the fork server, bwrap's child's child; the test's sandbox is the fork server's only
    one)."""
    if box.process_limit.cgroup is not None:
        return box.process_limit.processes()
    if box._fork_server is not None:
        init = process_children()[box._fork_server.proc.pid][0]
        fork_server = process_children()[init][0]
        return descendants(fork_server)
    assert box._proc is not None
    return [box._proc.pid, *descendants(box._proc.pid)]


def process_children() -> dict[int, list[int]]:
    """Each living process's children, from the parent pids in /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every living process below `pid`."""
    children = process_children()
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def is_supervisor(cmdline: bytes) -> bool:
    """The sandbox supervisor's command line: its source (-c), its compiled file (a sandbox over the host's root), or
    the fork server's (forked from the fork server, it keeps the fork server's command line)."""
    return (b"uni-agent sandbox supervisor" in cmdline or b"/uni-agent-sandbox-supervisor.pyc\0" in cmdline
            or b"uni-agent-fork-server" in cmdline)


def only_the_sandbox_itself(pids: list[int]) -> bool:
    commands = []
    for pid in pids:
        with contextlib.suppress(OSError):
            commands.append(Path(f"/proc/{pid}/cmdline").read_bytes())
    bwraps = [c for c in commands if c.startswith(b"bwrap\0")]
    supervisors = [c for c in commands if is_supervisor(c) and c not in bwraps]
    shells = [c for c in commands if c.endswith(b"/run/uni-agent/run.sh\0")]
    # bwrap's: bwrap and its init, the supervisor, a shell; the fork server's: the supervisor (pid 1) and a shell
    return len(bwraps) in (0, 2) and len(supervisors) == 1 and len(shells) <= 1 and len(commands) <= 2 + len(bwraps)


def test_process_cap_falls_back_to_ulimit_without_a_cgroup(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from uni_agent.sandbox.process_limit import probed_pids_cgroup_parent

    monkeypatch.setenv("UNI_AGENT_PIDS_CGROUP", "off")
    probed_pids_cgroup_parent.cache_clear()
    try:
        async def body(box: LocalSandbox) -> bytes:
            assert box.process_limit.mode == "ulimit" and box.process_limit.cgroup is None
            return (await box.exec("ulimit -u", 10)).stdout

        assert with_sandbox(repo, body, pids_limit=100) == b"100\n"
    finally:
        probed_pids_cgroup_parent.cache_clear()


# -- file transfer -------------------------------------------------------------------------------------------------


def test_write_and_read_file_round_trip_any_bytes(repo: Path) -> None:
    data = bytes(range(256)) * 64 + b"\x00\x00\xff\xff\n\r\n'\"$(touch /tmp/pwned)`x`"

    async def body(box: LocalSandbox) -> None:
        await write_file(box, "/testbed/new dir/deep/blob.bin", data)
        assert await read_file(box, "/testbed/new dir/deep/blob.bin") == data
        size = await box.exec("stat -c %s '/testbed/new dir/deep/blob.bin'; test -e /tmp/pwned || echo safe", 10)
        assert size.stdout == f"{len(data)}\nsafe\n".encode()
        await write_file(box, "/tmp/empty", b"")
        assert await read_file(box, "/tmp/empty") == b""
        # Overwrite, and a relative path (relative to the workdir).
        await write_file(box, "a.txt", b"\xff\x00")
        assert await read_file(box, "/testbed/a.txt") == b"\xff\x00"
        with pytest.raises(FileNotFoundError):
            await read_file(box, "/testbed/missing.txt")
        with pytest.raises(FileNotFoundError):
            await read_file(box, "/testbed/sub")  # a directory is not a file
        with pytest.raises(OSError):
            await write_file(box, "/usr/blob.bin", data)

    with_sandbox(repo, body)
    assert tree(repo) == REPO_FILES


# -- lifecycle -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workspace", ["auto", "copy"])
def test_close_removes_the_sandbox_and_leaves_nothing_mounted(repo: Path, tmp_path: Path, workspace: str) -> None:
    root = tmp_path / "sandboxes"

    async def main() -> None:
        box = LocalDeploymentConfig(repo=str(repo), workspace=workspace).build({}, "closing")
        assert isinstance(box, LocalSandbox)
        await box.start()
        assert box.dir is not None
        box_dir = box.dir
        assert box_dir.parent == root and box_dir.name.startswith("closing-")
        assert (await box.exec("echo x > /testbed/f; echo y > /tmp/g", 10)).exit_code == 0
        assert mount_lines(str(box_dir)) == []  # the overlay lives only in each command's mount namespace
        await box.close()
        assert not box_dir.exists()
        assert list(root.iterdir()) == []
        assert mount_lines(str(box_dir)) == []
        assert mount_lines(str(root)) == []
        with pytest.raises(SandboxError):
            await box.exec("true", 10)
        await box.close()  # closing twice is harmless

    run(main())


def test_async_with_closes(repo: Path, tmp_path: Path) -> None:
    async def main() -> Path:
        box = LocalDeploymentConfig(repo=str(repo)).build({}, "ctx")
        assert isinstance(box, LocalSandbox)
        async with box:
            assert box.dir is not None and box.dir.is_dir()
            return box.dir

    box_dir = run(main())
    assert not box_dir.exists()
    assert list((tmp_path / "sandboxes").iterdir()) == []


def test_a_start_cancelled_while_its_dir_is_made_leaves_no_dir(repo: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollout whose first model call fails cancels its sandbox's start, which can be in the thread that makes the
    sandbox's dir: the start waits for that thread, and the close that follows (as start_sandbox's) removes the dir.
    (The dir used to be made after the close had looked for it, and stayed.)"""
    import threading

    import uni_agent.sandbox.local as local

    making = threading.Event()
    make_dir = local.make_private_subdir

    def slow_make_dir(*args: Any, **kwargs: Any) -> Path:
        making.set()
        time.sleep(0.5)  # the cancel arrives meanwhile
        return make_dir(*args, **kwargs)

    monkeypatch.setattr(local, "make_private_subdir", slow_make_dir)

    async def main() -> str:
        box = LocalDeploymentConfig(repo=str(repo)).build({}, "cancelled")

        async def start() -> None:
            try:
                await box.start()
            except BaseException:
                await box.close()
                raise

        starting = asyncio.ensure_future(start())
        assert await asyncio.to_thread(making.wait, 30)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        return box.name

    name = run(main())  # asyncio.run returns once every thread of the loop's executor has finished
    assert not (tmp_path / "sandboxes" / name).exists()
    assert list((tmp_path / "sandboxes").iterdir()) == []


def test_missing_repo_raises_start_error(repo: Path, tmp_path: Path) -> None:
    async def start(repo_ref: str) -> None:
        box = LocalDeploymentConfig(repo=repo_ref).build({}, "missing")
        try:
            await box.start()
        finally:
            await box.close()

    with pytest.raises(SandboxStartError, match="not found"):
        run(start(str(tmp_path / "no-such-repo")))
    with pytest.raises(SandboxStartError, match="bundled:no-such-task"):
        run(start("bundled:no-such-task"))
    with pytest.raises(SandboxStartError):
        LocalDeploymentConfig(repo=None).build({}, "none")
    assert not (tmp_path / "sandboxes").exists() or list((tmp_path / "sandboxes").iterdir()) == []


def test_bundled_repo_reference_starts(repo: Path) -> None:
    from uni_agent.tasks.swe_form import BUNDLED_DIR

    task = sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "repo").is_dir())[0]
    expected = sorted(p.name for p in (BUNDLED_DIR / task / "repo").iterdir()
                      if p.name not in ("__pycache__", ".pytest_cache", ".git"))

    async def main() -> list[str]:
        box = LocalDeploymentConfig(repo=f"bundled:{task}").build({}, "bundled")
        await box.start()
        try:
            return (await box.exec("ls -A | grep -vx .git", 10)).output.split()
        finally:
            await box.close()

    assert sorted(run(main())) == expected


# -- regressions found in review ------------------------------------------------------------------------------------


def test_stdin_does_not_defeat_the_timeout(repo: Path) -> None:
    async def body(box: LocalSandbox) -> tuple[ExecResult, ExecResult, float]:
        started = time.monotonic()
        ignores_input = await box.exec("sleep 6", 1, stdin=b"x" * 1_000_000)
        writes_first = await box.exec("head -c 1000000 /dev/zero; cat >/dev/null; echo done", 20,
                                      stdin=b"x" * 1_000_000)
        return ignores_input, writes_first, time.monotonic() - started

    ignores_input, writes_first, elapsed = with_sandbox(repo, body)
    assert ignores_input.timed_out and ignores_input.exit_code is None
    assert not writes_first.timed_out and writes_first.stdout.endswith(b"done\n")
    assert len(writes_first.stdout) == 1_000_000 + len(b"done\n")
    assert elapsed < 15


def test_concurrent_execs_each_run_their_own_command(repo: Path) -> None:
    async def body(box: LocalSandbox) -> list[bytes]:
        results = await asyncio.gather(*(box.exec(f"echo {word}", 10) for word in ("A", "B", "C")))
        return [r.stdout for r in results]

    assert with_sandbox(repo, body) == [b"A\n", b"B\n", b"C\n"]


def test_unset_of_a_configured_variable_sticks(repo: Path) -> None:
    async def body(box: LocalSandbox) -> bytes:
        await box.exec("unset PAGER", 10)
        return (await box.exec("echo [${PAGER-unset}]", 10)).stdout

    assert with_sandbox(repo, body, env={"PAGER": "cat"}) == b"[unset]\n"


def test_orphaned_sandbox_dirs_are_reaped(repo: Path, tmp_path: Path) -> None:
    from uni_agent.sandbox import local

    root = tmp_path / "sandboxes"
    root.mkdir(exist_ok=True)
    dead = subprocess_pid_that_exited()
    orphan, alive, foreign = root / "orphan", root / "alive", root / "foreign"
    for d in (orphan, alive, foreign):
        (d / "upper").mkdir(parents=True)
    (orphan / local.OWNER_FILE).write_text(str(dead))
    (alive / local.OWNER_FILE).write_text(str(os.getpid()))
    assert local.reap_orphaned_sandboxes(root) == [orphan]
    assert not orphan.exists() and alive.exists() and foreign.exists()


def test_a_removal_cut_short_leaves_a_dir_the_next_reap_finishes(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed -9 while it removed a sandbox dir (its own at close, or a dead one's in a reap): what is left
    still names its owner, so a later reap removes it; it never keeps only `state/`, which no reap would touch."""
    from uni_agent.sandbox import leftovers, local

    root = tmp_path / "sandboxes"
    box = root / "box"
    for sub in ("upper", "state", "tmp"):
        (box / sub).mkdir(parents=True)
    (box / "state" / "run.sh").write_text("x")
    (box / local.OWNER_FILE).write_text(str(subprocess_pid_that_exited()))
    removed = []

    def killed_after_the_first(path: str) -> None:  # the worker dies during the second removal
        if removed:
            raise SystemExit("killed")
        removed.append(path)
        shutil.rmtree(path)

    with monkeypatch.context() as patched:
        patched.setattr(leftovers, "remove_tree", killed_after_the_first)
        with pytest.raises(SystemExit):
            leftovers.remove_sandbox_dir(box)
    assert len(removed) == 1 and (box / local.OWNER_FILE).exists()
    assert local.reap_orphaned_sandboxes(root) == [box] and not box.exists()


def test_a_start_reaps_a_dead_owners_dir_at_most_every_reap_interval(repo: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A start reaps the root (a dead worker's dir goes), the next start within REAP_EVERY_S does not list it again,
    and the first start after the interval does."""
    from uni_agent.sandbox import leftovers, local

    root = Path(os.environ["UNI_AGENT_SANDBOX_ROOT"])
    clock = [1000.0]
    monkeypatch.setattr(leftovers.time, "monotonic", lambda: clock[0])

    def orphan(name: str) -> Path:
        (root / name / "upper").mkdir(parents=True)
        (root / name / local.OWNER_FILE).write_text(str(subprocess_pid_that_exited()))
        return root / name

    async def start_one(name: str) -> None:
        async with sandbox(repo, name=name):
            pass

    first = orphan("first-orphan")
    run(start_one("a"))
    assert not first.exists()
    second = orphan("second-orphan")
    clock[0] += leftovers.REAP_EVERY_S / 2
    run(start_one("b"))
    assert second.exists(), "a start within the interval reaped again"
    clock[0] += leftovers.REAP_EVERY_S
    run(start_one("c"))
    assert not second.exists()


def test_sandboxes_closed_together_are_removed_on_the_one_removal_thread(repo: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A wave's sandboxes closing at once remove their dirs one after another on the process's removal thread
    (concurrent removals cost more CPU for no gain in time), and every dir is gone when its close returns."""
    from uni_agent.sandbox import leftovers

    threads: list[str] = []
    running = [0]
    most = [0]
    real = leftovers.remove_sandbox_dir

    def watched(path: Any) -> None:
        threads.append(threading.current_thread().name)
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            time.sleep(0.01)  # long enough that removals on several threads would overlap
            real(path)
        finally:
            running[0] -= 1

    monkeypatch.setattr(leftovers, "remove_sandbox_dir", watched)

    async def main() -> list[Path]:
        boxes = [LocalDeploymentConfig(repo=str(repo)).build({}, f"w{i}") for i in range(6)]
        await asyncio.gather(*(box.start() for box in boxes))
        dirs = [box.dir for box in boxes]
        await asyncio.gather(*(box.close() for box in boxes))
        return dirs

    dirs = run(main())
    assert len(threads) == 6 and most[0] == 1
    assert {name.startswith("uni-agent-removal") for name in threads} == {True}
    assert not [d for d in dirs if d is not None and d.exists()]


def test_a_forked_child_removes_a_dir_on_a_removal_thread_of_its_own(tmp_path: Path) -> None:
    """The removal thread is made per process: a child forked after the parent used it does not hand its removals to
    an executor whose thread it never had (they would wait forever)."""
    from uni_agent.sandbox import leftovers

    (tmp_path / "parent" / "upper").mkdir(parents=True)
    run(leftovers.remove_in_removal_thread(tmp_path / "parent"))  # the parent's removal thread now exists
    (tmp_path / "child" / "upper").mkdir(parents=True)
    pid = os.fork()
    if pid == 0:  # the child: removes its dir, or is ended by the alarm
        try:
            signal.alarm(20)
            run(leftovers.remove_in_removal_thread(tmp_path / "child"))
            os._exit(0 if not (tmp_path / "child").exists() else 2)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert not (tmp_path / "parent").exists()
    assert os.waitstatus_to_exitcode(status) == 0 and not (tmp_path / "child").exists()


OWNER_SCRIPT = """
import asyncio, sys
from uni_agent.sandbox.local import LocalDeploymentConfig, LocalSandbox

async def main():
    box = LocalSandbox(LocalDeploymentConfig(repo=sys.argv[1], pids_limit=64), name="killed-owner")
    await box.start()
    print("SANDBOX", box.dir, box.process_limit.cgroup or "-", flush=True)
    await box.exec("sleep 300 & sleep 300 & cat /dev/zero | sleep 300", 600)

asyncio.run(main())
"""


def test_a_killed_owner_leaves_no_process_and_its_leftovers_are_reaped(repo: Path) -> None:
    """kill -9 of the process that owns a sandbox in the middle of a command (the overlay mounted, children
    running): its processes die with it, nothing stays mounted, and the next reap removes its dir and cgroup (where
    it has one: as an ordinary user it caps its processes with `ulimit -u` instead)."""
    import subprocess
    import sys

    from uni_agent.sandbox import local

    owner = subprocess.Popen([sys.executable, "-c", OWNER_SCRIPT, str(repo)], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        # Its line, past any log line the library writes to stdout (structlog's default, nothing configured here).
        line = poll_until(lambda: owner_line(owner), 60, "the owner's sandbox")
        sandbox_dir, cgroup = Path(line[0]), (Path(line[1]) if line[1] != "-" else None)
        # The command and its three children are running (inside the sandbox's cgroup, where it has one).
        sleeps = poll_until(lambda: found if len(found := sleeping(owner.pid)) >= 3 else None, 30,
                            "the sandbox command")
        sandbox = descendants(owner.pid)
        if cgroup is not None:
            assert set(sleeps) <= {int(p) for p in (cgroup / "cgroup.procs").read_text().split()}
        owner.kill()
        owner.wait(30)
    finally:
        if owner.poll() is None:
            owner.kill()
    assert not wait_until_gone(sandbox, 30), "the sandbox's processes outlived their owner"
    if cgroup is not None:
        poll_until(lambda: not (cgroup / "cgroup.procs").read_text().split(), 30,
                   "the sandbox's cgroup to empty with its owner")
    poll_until(lambda: not [cmd for cmd in map(_cmd, Path("/proc").glob("[0-9]*")) if str(sandbox_dir) in cmd], 30,
               "the holder of the sandbox's mount namespace to die with its owner")
    assert str(sandbox_dir) not in Path("/proc/self/mounts").read_text()
    if cgroup is not None:
        assert cgroup.name.startswith(f"{owner.pid}-")  # cgroups are machine-wide: named after their owner
    assert local.reap_orphaned_sandboxes(sandbox_dir.parent) == [sandbox_dir]
    assert not sandbox_dir.exists() and (cgroup is None or not cgroup.exists())


def sleeping(owner: int) -> list[int]:
    """The `sleep 300` processes OWNER_SCRIPT's command started."""
    return [pid for pid in descendants(owner) if _cmd(Path(f"/proc/{pid}")) == "sleep 300 "]


def owner_line(owner: Any) -> list[str] | None:
    """The fields of OWNER_SCRIPT's SANDBOX line, reading past other lines; None until it comes."""
    line = owner.stdout.readline().decode()
    assert line or owner.poll() is None, "the owner exited before it started its sandbox"
    return line.split()[1:] if line.startswith("SANDBOX ") else None


def test_a_dead_owners_cgroup_is_reaped_whatever_root_its_sandbox_used(repo: Path, tmp_path: Path) -> None:
    """A worker that used another sandbox root (or whose root nobody scans again) left an empty cgroup: the reap at
    any sandbox start removes it, and leaves a live owner's alone."""
    from uni_agent.sandbox import local
    from uni_agent.sandbox.process_limit import pids_cgroup_parent

    parent = pids_cgroup_parent()
    if parent is None and os.geteuid() != 0:
        pytest.skip("needs a writable pids cgroup, which an ordinary user does not have (sandboxes use ulimit -u)")
    assert parent is not None
    dead, alive = parent / f"{subprocess_pid_that_exited()}-gone-sbx", parent / f"{os.getpid()}-live-sbx"
    dead.mkdir()
    alive.mkdir()
    try:
        (tmp_path / "empty-root").mkdir()
        assert local.reap_orphaned_sandboxes(tmp_path / "empty-root") == []  # no sandbox dir there at all
        assert not dead.exists() and alive.exists()
    finally:
        for cgroup in (dead, alive):
            if cgroup.exists():
                cgroup.rmdir()


def subprocess_pid_that_exited() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
