"""A sandbox is a live machine: the session semantics every backend shares, on real local and podman sandboxes.

(Modal runs the same session through its fake in test_sandbox_modal.py: its cloud cannot be reached from here.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import REPO_ROOT
from test_sandbox_container import image  # noqa: F401 - the podman test image, a session fixture
from test_sandbox_local import is_supervisor, processes_with, wait_until_gone

from uni_agent.sandbox import Sandbox, SandboxError
from uni_agent.sandbox.container import ContainerDeploymentConfig
from uni_agent.sandbox.local import LocalDeploymentConfig
from uni_agent.sandbox.supervisor import CAPTURE_LIMIT_BYTES, SPARE_SHELL_DELAY_S

T = TypeVar("T")
BACKENDS = ["local", "podman"]
# `ps` without procps (the podman test image has none): every process's command line, one per line.
# stderr is sent away before the file is opened: a process that ends between the glob and the read must not print.
PS = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' 2>/dev/null < $f; echo; done"


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UNI_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    return repo


@pytest.fixture(params=BACKENDS)
def open_sandbox(request: pytest.FixtureRequest, repo: Path) -> Callable[..., Sandbox]:
    """Makes a sandbox of the backend under test (not started)."""
    backend = request.param

    def make(**overrides: Any) -> Sandbox:
        if backend == "local":
            return LocalDeploymentConfig(repo=str(repo), **overrides).build({}, "sess")
        tag = request.getfixturevalue("image")
        config = ContainerDeploymentConfig(type="podman", image=tag, pull="never", repo=str(repo), **overrides)
        return config.build({}, "sess")

    return make


def with_box(make: Callable[..., Sandbox], body: Callable[[Sandbox], Awaitable[T]], **overrides: Any) -> T:
    async def main() -> T:
        async with make(**overrides) as box:
            return await body(box)

    return asyncio.run(main())


def test_a_server_started_in_one_command_answers_in_the_next(open_sandbox: Callable[..., Sandbox]) -> None:
    port = 20000 + uuid.uuid4().int % 20000
    fetch = f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/a.txt').read())\""

    async def body(box: Sandbox) -> tuple[Any, ...]:
        started = await box.exec(f"nohup python3 -m http.server {port} > /tmp/server.log 2>&1 &", 10)
        for _ in range(100):  # the server needs a moment to listen
            answer = await box.exec(fetch, 10)
            if answer.exit_code == 0:
                break
            await asyncio.sleep(0.1)
        # Not even redirected: the server holds the command's output pipe, and the command still returns at once.
        t0 = time.monotonic()
        unredirected = await box.exec(f"python3 -m http.server {port + 1} &", 10)
        return started, answer, unredirected, time.monotonic() - t0, (await box.exec(PS, 10)).output

    started, answer, unredirected, seconds, ps = with_box(open_sandbox, body)
    assert started.exit_code == 0 and not started.timed_out
    assert answer.exit_code == 0 and answer.stdout == b"b'a\\n'\n", answer
    assert unredirected.exit_code == 0 and seconds < 5
    assert f"http.server {port}" in ps and f"http.server {port + 1}" in ps


def test_a_background_process_survives_a_later_commands_timeout(open_sandbox: Callable[..., Sandbox]) -> None:
    marker = f"3{uuid.uuid4().int % 10000}.5"

    async def body(box: Sandbox) -> tuple[Any, ...]:
        await box.exec(f"sleep {marker} > /dev/null 2>&1 &", 10)
        late = await box.exec("sleep 30", 1)
        alive = await box.exec(f"{PS} | grep -q '^sleep {marker}' && echo alive", 10)
        return late, alive

    late, alive = with_box(open_sandbox, body)
    assert late.timed_out and late.exit_code is None
    assert alive.stdout == b"alive\n"
    # ... and it goes with the sandbox.
    assert wait_until_gone(processes_with(f"sleep\0{marker}".encode()), timeout=10) == []


def test_cwd_exports_and_unset_persist(open_sandbox: Callable[..., Sandbox]) -> None:
    async def body(box: Sandbox) -> bytes:
        await box.exec("mkdir -p d && cd d && export A=1 B=2", 10)
        await box.exec("unset B; export C=3; exit 7", 10)
        return (await box.exec('pwd; echo "$A-${B:-unset}-$C"', 10)).stdout

    assert with_box(open_sandbox, body) == b"/testbed/d\n1-unset-3\n"


def test_a_command_starts_as_from_a_plain_shell(open_sandbox: Callable[..., Sandbox]) -> None:
    """The supervisor starts each command's shell itself (fork and exec): the command gets default SIGPIPE (a pipe
    reader that quits ends `yes`), no descriptor but its three pipes, and a process group of its own, in the
    sandbox's one session (a session per command would be a scheduling autogroup per command)."""
    ids = "ids() { awk '{print $5, $6}' /proc/$1/stat; }; echo $(ids $$) $$"

    async def body(box: Sandbox) -> list[bytes]:
        pipe = await box.exec("yes | head -n 1; echo ${PIPESTATUS[@]}", 10)
        fds = await box.exec("ls /proc/self/fd | sort -n | tr '\\n' ' '", 10)
        return [pipe.stdout, fds.stdout, (await box.exec(ids, 10)).stdout, (await box.exec(ids, 10)).stdout]

    pipe, fds, first, second = with_box(open_sandbox, body)
    assert pipe == b"y\n141 0\n"  # yes died of SIGPIPE (128 + 13), as in any shell
    assert fds.split() == [b"0", b"1", b"2", b"3"], fds  # 3: the directory `ls` reads
    group, sid, pid = first.split()
    assert group == pid, first  # the shell leads its own group (so a timeout kills its group, nothing else)
    assert sid != pid and second.split()[1] == sid, (first, second)  # no session of its own: the sandbox's


def test_the_next_commands_shell_starts_half_a_second_after_a_command_not_in_its_burst(
        open_sandbox: Callable[..., Sandbox]) -> None:
    """The shell of the next command is started ahead, but SPARE_SHELL_DELAY_S after a command ends, not at once: the
    commands of a wave end together, and their next shells competed with the commands still running. A command that
    comes sooner starts its own shell. Times in seconds since boot, as the sandbox reads them (/proc)."""
    # this command's shell's start (/proc/$$/stat, field 22, in clock ticks) and the time now
    times = "read -r -a stat < /proc/$$/stat; read -r now _ < /proc/uptime; echo ${stat[21]} $now"
    tick = os.sysconf("SC_CLK_TCK")

    async def body(box: Sandbox) -> list[tuple[float, float]]:
        seen = []
        for pause in (0, 0.2, 2.0):  # before the next command: sooner than the delay, then later
            await asyncio.sleep(pause)
            started, now = (await box.exec(times, 10)).stdout.split()
            seen.append((int(started) / tick, float(now)))
        return seen

    (_, first_end), (soon_start, soon_end), (later_start, _) = with_box(open_sandbox, body)
    # sent 0.2 s after the first ended: its shell started then, when it came (ticks round down: 0.01 s)
    assert soon_start - first_end >= 0.18, (first_end, soon_start)
    # sent 2 s after the second ended: its shell had been started ahead, the delay after that command's end
    assert SPARE_SHELL_DELAY_S - 0.02 <= later_start - soon_end < 1.5, (soon_end, later_start)


def test_a_timeout_kills_only_its_own_command(open_sandbox: Callable[..., Sandbox]) -> None:
    async def body(box: Sandbox) -> tuple[Any, ...]:
        await box.exec("sleep 300 > /dev/null 2>&1 &", 10)
        killed = await box.exec("sleep 301 & sleep 302", 1)
        left = (await box.exec(f"{PS} | grep '^sleep 30' | sort", 10)).stdout
        return killed, left

    killed, left = with_box(open_sandbox, body)
    assert killed.timed_out
    assert left == b"sleep 300 \n"  # the command's own group (301, 302) is gone; the earlier one is not


def test_output_that_never_ends_is_cut_at_the_cap(open_sandbox: Callable[..., Sandbox]) -> None:
    async def body(box: Sandbox) -> Any:
        return await box.exec("yes", 3)

    result = with_box(open_sandbox, body)
    assert result.timed_out and len(result.stdout) == CAPTURE_LIMIT_BYTES and result.truncated_bytes > 0


def test_a_killed_supervisor_is_a_clear_error_never_a_hang(open_sandbox: Callable[..., Sandbox]) -> None:
    marker = f"4{uuid.uuid4().int % 10000}.5"

    async def body(box: Sandbox) -> tuple[str, float]:
        task = asyncio.create_task(box.exec(f"sleep {marker}", 200))
        deadline = time.monotonic() + 20
        while not (sleeps := processes_with(f"sleep\0{marker}".encode())):
            assert time.monotonic() < deadline, "the command never started"
            await asyncio.sleep(0.05)
        started = time.monotonic()
        os.kill(_supervisor_above(sleeps[0]), signal.SIGKILL)
        with pytest.raises(SandboxError, match="gone") as caught:
            await task
        with pytest.raises(SandboxError):
            await box.exec("true", 10)
        return str(caught.value), time.monotonic() - started

    message, seconds = with_box(open_sandbox, body)
    assert "supervisor" in message and seconds < 15, message
    assert wait_until_gone(processes_with(f"sleep\0{marker}".encode()), timeout=10) == []


def _supervisor_above(pid: int) -> int:
    """The sandbox supervisor among the ancestors of a process (host pids)."""
    while pid > 1:
        if is_supervisor(Path(f"/proc/{pid}/cmdline").read_bytes()):
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("no supervisor above the command")


def test_a_thousand_commands_do_not_grow_fds_or_memory(open_sandbox: Callable[..., Sandbox]) -> None:
    probe = "ls /proc/$PPID/fd | wc -l; awk '/^VmRSS/ {print $2}' /proc/$PPID/status"

    async def body(box: Sandbox) -> tuple[list[int], list[int], int]:
        for _ in range(20):  # past the first commands, whose shells are started on demand
            await box.exec("echo x", 10)
        # stderr kept apart: with it merged, whether its pipe is closed yet when `ls` runs is a race.
        first = (await box.exec(probe, 10, merge_stderr=False)).stdout.split()
        for _ in range(1000):
            await box.exec("echo x", 10)
        last = (await box.exec(probe, 10, merge_stderr=False)).stdout.split()
        return [int(x) for x in first], [int(x) for x in last], os.getpid()

    first, last, _ = with_box(open_sandbox, body)
    fds_before, rss_before = first
    fds_after, rss_after = last
    assert fds_after <= fds_before, (first, last)
    assert rss_after - rss_before < 2048, (first, last)  # kB: no per-command growth


CHILD_PROBE = r"""
import os, sys
from uni_agent.sandbox import supervisor
if sys.argv[1] == "fork":
    del os.posix_spawn  # as on Python < 3.8
passed_r, passed_w = os.pipe()
script = ('read -r line <&"$PASSED"; echo "$line"; awk \'{print $5 == $1 && $6 != $1}\' /proc/$$/stat; '
          'grep SigIgn /proc/$$/status; for f in {0..64}; do [ -e /proc/$$/fd/$f ] && printf "$f "; done; echo; '
          'echo err >&2')  # a stat per fd: a pipeline or `ls` would open descriptors of its own while it looks
child = supervisor.Child(["/bin/bash", "-c", script], {"PASSED": str(passed_r)}, passed_r)
os.close(passed_r)
os.write(passed_w, b"through the passed fd\n")
os.close(passed_w)
child.stdin.close()
out, err = child.stdout.read(), child.stderr.read()
_, status = os.waitpid(child.pid, 0)
print(status, passed_r, err.decode().strip())
sys.stdout.write(out.decode())
"""


@pytest.mark.parametrize("method", ["posix_spawn", "fork"])
def test_the_supervisors_child_starts_alike_either_way(method: str) -> None:
    """Where Python lacks posix_spawn (< 3.8, an old image) the supervisor forks: the shell it starts must look the
    same, a process group leader (not a session leader) with default SIGPIPE, its stdio on pipes and the passed fd
    open, nothing else. (In a fresh process, whose descriptors are only its own.)"""
    done = subprocess.run([sys.executable, "-I", "-c", CHILD_PROBE, method], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr
    head, passed, session, ignored, fds = done.stdout.splitlines()
    status, passed_fd, err = head.split()
    assert (status, err) == ("0", "err"), head
    assert passed == "through the passed fd" and session == "1", done.stdout  # its own group, not its own session
    assert int(ignored.split()[1], 16) & (1 << (signal.SIGPIPE - 1)) == 0, ignored  # SIGPIPE not ignored
    assert fds.split() == ["0", "1", "2", passed_fd], fds  # no descriptor of the supervisor's own
