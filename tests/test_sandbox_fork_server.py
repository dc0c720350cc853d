"""The fork server (uni_agent/sandbox/fork_server.py): local sandboxes forked by one bwrap per worker process.

Real fork servers, real sandboxes, real namespaces: two sandboxes of one fork server must be as far apart as two bwraps
(files, processes, /tmp, the root, the fork server's views), hold no capabilities, and go with everything they started;
the fork server must say plainly what it cannot serve, and a dead fork server must fail its sandboxes and be
replaced."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import pytest
from test_sandbox_local import processes_with, repo, run, sandbox, wait_until_gone  # noqa: F401 - repo: a fixture

from uni_agent.sandbox import SandboxError
from uni_agent.sandbox.local import LocalSandbox


def test_two_sandboxes_of_one_fork_server_see_nothing_of_each_other(repo: Path) -> None:  # noqa: F811
    marker = f"4{uuid.uuid4().int % 10000}.5"

    async def main() -> tuple[dict[str, str], str, bool]:
        async with sandbox(repo, name="a") as a, sandbox(repo, name="b") as b:
            assert a._fork_server is not None and a._fork_server is b._fork_server and a._proc is None
            wrote = await a.exec(f"echo a > a.txt && echo a > /tmp/f && echo a > /f && echo a > /dev/shm/f && "
                                 f"(sleep {marker} > /dev/null 2>&1 &)", 10)
            assert wrote.exit_code == 0, wrote.output
            seen = {}
            for what, command in {
                "files": "cat a.txt; cat /tmp/f /f /dev/shm/f 2>&1 | grep -c 'No such'",
                "processes": f"ps -eo args | grep -c '^sleep {marker}' || true",
                "fork_server": "ls /run/uni-agent-fork-server 2>&1 | grep -c 'No such'",
                "capabilities": "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status | awk '{print $2}' | sort -u",
                "root": ("touch /usr/x 2>&1 | grep -c 'Read-only'; "
                         "mkdir -p /mnt; mount -t tmpfs t /mnt 2>&1 | grep -c denied"),
                "loopback": "python3 -c \"import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print('up')\"",
            }.items():
                seen[what] = (await b.exec(command, 10)).output.strip()
            mine = (await a.exec(f"ps -eo args | grep -c '^sleep {marker}'", 10)).output.strip()
            alive_during = bool(processes_with(f"sleep\0{marker}".encode()))
        return seen, mine, alive_during

    seen, mine, alive_during = run(main())
    assert seen["files"] == "original a\n3", seen  # a.txt as in the repo; /tmp/f, /f, /dev/shm/f not there
    assert seen["processes"] == "0" and mine == "1", (seen, mine)
    assert seen["fork_server"] == "1", seen
    assert seen["capabilities"] == "0000000000000000", seen
    assert seen["root"] == "1\n1", seen
    assert seen["loopback"] == "up", seen
    assert alive_during  # the background sleep ran, and is gone with its sandbox:
    assert wait_until_gone(processes_with(f"sleep\0{marker}".encode()), timeout=10) == []


def test_launcher_bwrap_starts_a_bwrap_of_its_own(repo: Path) -> None:  # noqa: F811
    async def main() -> tuple[bool, bool, str]:
        async with sandbox(repo, launcher="bwrap") as box:
            return box._fork_server is None, box._proc is not None, (await box.exec("cat a.txt", 10)).output

    assert run(main()) == (True, True, "original a\n")


def test_launcher_fork_server_says_what_it_cannot_serve(repo: Path) -> None:  # noqa: F811
    async def main() -> None:
        async with sandbox(repo, launcher="fork_server", network=True):
            pass

    with pytest.raises(SandboxError, match="`launcher: fork_server` cannot start it: it has the network"):
        run(main())


def test_a_dead_fork_server_fails_its_sandboxes_and_the_next_start_gets_a_new_one(repo: Path) -> None:  # noqa: F811
    async def main() -> tuple[str, int, int, str]:
        async with sandbox(repo, name="first") as first:
            fork_server = first._fork_server
            assert fork_server is not None
            os.killpg(fork_server.proc.pid, signal.SIGKILL)  # bwrap and everything under it: the server, its sandboxes
            with pytest.raises(SandboxError) as caught:
                for _ in range(50):  # the stream ends once the kernel has taken the sandbox down
                    await first.exec("true", 10)
                    await asyncio.sleep(0.1)
            async with sandbox(repo, name="second") as second:
                assert second._fork_server is not None
                output = (await second.exec("cat b.txt", 10)).output
                return str(caught.value), fork_server.proc.pid, second._fork_server.proc.pid, output

    message, dead, new, output = run(main())
    assert "fork server" in message, message
    assert new != dead and output == "original b\n"


def test_a_sandbox_whose_stream_fails_on_a_write_says_why_as_a_failed_read_does() -> None:
    """Which side of a dead sandbox's stream notices first is a race: the read (the supervisor's stdout at its end,
    whose message says how the sandbox ended) or the next request's write (a reset pipe). The write's error said only
    "could not reach the supervisor (ConnectionResetError)" (CI on a clean clone, 2026-12-07: the test above); it now
    asks the transport how the sandbox ended, as the read does."""
    from uni_agent.sandbox.session import Session

    async def reset(data: bytes | None) -> None:
        raise ConnectionResetError("reset by peer")

    async def describe_end() -> str:
        return "the sandbox's pid 1 in the fork server (pid 4242, gone) ended"

    async def main() -> str:
        session = Session("s1", asyncio.StreamReader(), reset, describe_end)
        with pytest.raises(SandboxError) as caught:
            await session._send_message(b"run 1\n")
        return str(caught.value)

    message = run(main())
    assert "could not reach the supervisor (ConnectionResetError)" in message, message
    assert "fork server (pid 4242, gone) ended" in message, message



NICE_AND_GROUP = "awk '{print $19}' /proc/$$/stat; cat /proc/$$/autogroup 2>/dev/null || echo none"


@pytest.mark.parametrize("launcher", ["fork_server", "bwrap"])
def test_sandboxes_run_cpu_nice_below_the_worker(repo: Path, launcher: str) -> None:  # noqa: F811
    """`cpu_nice` steps below the worker, whichever way the sandbox starts; 0 keeps them level. In the fork server, the
    sandboxes share the fork server's one scheduling autogroup, at the same nice, instead of one each (a session
    each)."""
    ours = os.nice(0)
    autogroups = launcher == "fork_server" and os.path.exists("/proc/self/autogroup")

    async def seen_in(box: LocalSandbox) -> tuple[int, str]:
        for _ in range(30):  # the server sets its autogroup's nice at once, or, when the kernel says later, 0.11 s on
            result = await box.exec(NICE_AND_GROUP, 10)
            assert result.exit_code == 0, result.output
            nice, group = result.stdout.decode().split("\n", 1)
            if not autogroups or box.config.cpu_nice == 0 or group.split()[-2:] == ["nice", "7"]:
                break
            await asyncio.sleep(0.1)
        return int(nice), group

    async def main() -> list[tuple[int, str]]:
        async with sandbox(repo, name="a", launcher=launcher, cpu_nice=7) as a, \
                sandbox(repo, name="b", launcher=launcher, cpu_nice=7) as b, \
                sandbox(repo, name="level", launcher=launcher, cpu_nice=0) as level:
            return [await seen_in(box) for box in (a, b, level)]

    (a_nice, a_group), (b_nice, b_group), (level_nice, level_group) = run(main())
    assert a_nice == b_nice == min(ours + 7, 19) and level_nice == ours, (a_nice, b_nice, level_nice, ours)
    if autogroups:
        assert a_group == b_group and a_group.split()[-2:] == ["nice", "7"], (a_group, b_group)  # one, at nice 7
        assert level_group not in (a_group, open("/proc/self/autogroup").read()), level_group  # the other fork server's


def test_a_fork_server_sandbox_keeps_its_shell_state_off_the_disk(repo: Path) -> None:  # noqa: F811
    """Each command's saved shell state (the exported environment, secrets included) is rewritten after every command:
    on the sandbox's own tmpfs, not in its dir on the host's disk."""
    async def main() -> tuple[str, str, list[str]]:
        async with sandbox(repo, env={"UA_SECRET": "s3cret"}) as box:
            assert box._fork_server is not None and box.dir is not None
            await box.exec("export KEPT=1 && cd sub", 10)
            kept = (await box.exec("echo $UA_SECRET $KEPT $PWD", 10)).output.strip()
            filesystem = (await box.exec("stat -f -c %T /run/uni-agent", 10)).output.strip()
            return kept, filesystem, os.listdir(box.dir / "state")

    kept, filesystem, on_disk = run(main())
    assert kept == "s3cret 1 /testbed/sub"  # the state still carries from one command to the next
    assert filesystem == "tmpfs" and on_disk == []
