"""The container backend, for real: podman + runc on a Debian image built here (tests/container_image.py).

Every test checks that no labelled container is left behind, whatever path it took (closed, failed, cancelled,
timed out, owner killed). Processes inside a rootful podman container are visible in the host's /proc, which is how
the tests see that a killed command is really gone.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from container_image import image_for_tests
from test_sandbox_local import processes_with, wait_until_gone

from uni_agent.episode.agent_loop import start_sandbox
from uni_agent.config import AgentConfigs
from uni_agent.sandbox import Sandbox, SandboxError, SandboxStartError, read_file, write_file
from uni_agent.sandbox import session as session_module
from uni_agent.sandbox.container import ContainerDeploymentConfig, ContainerSandbox
from uni_agent.sandbox.container_reap import LABEL, OWNER_LABEL, list_containers, owner_id, reap
from uni_agent.sandbox.limiter import start_limits
from uni_agent.sandbox.local import CAPTURE_LIMIT_BYTES
from uni_agent.tasks.swe_form import BUNDLED_DIR, load_instance
from uni_agent.grading import verify_patch

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parent.parent
PODMAN_CONFIG = REPO_ROOT / "examples" / "agent_interaction" / "agent_config_podman.yaml"


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def image() -> str:
    tag, seconds = image_for_tests()  # a failure where it could be built; a skip where only root could
    if seconds:
        print(f"\nbuilt {tag} in {seconds:.1f}s")
    return tag


def labelled_containers(owner: str | None = None) -> set[str]:
    """Our sandbox containers; with `owner`, only those started by that process (others may run tests too)."""
    label = f"{OWNER_LABEL}={owner}" if owner else f"{LABEL}=1"
    out = subprocess.run(["podman", "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `predicate` until true; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_leftover_containers(image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("UNI_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    before = labelled_containers(owner_id())
    yield
    left = labelled_containers(owner_id()) - before
    assert not left, f"containers left behind: {left}"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "a.txt").write_bytes(b"original a\n")
    (repo / "sub" / "c.py").write_bytes(b"VALUE = 1\n")
    return repo


def config(image: str, **overrides: Any) -> ContainerDeploymentConfig:
    return ContainerDeploymentConfig(**{"type": "podman", "image": image, "pull": "never", **overrides})


@asynccontextmanager
async def container(image: str, env: dict[str, str] | None = None, name: str = "t", **overrides: Any
                    ) -> AsyncIterator[ContainerSandbox]:
    box = config(image, **overrides).build(env or {}, name)
    assert isinstance(box, ContainerSandbox) and isinstance(box, Sandbox)
    async with box:
        yield box


def with_container(image: str, body: Callable[[ContainerSandbox], Awaitable[T]], **kwargs: Any) -> T:
    async def main() -> T:
        async with container(image, **kwargs) as box:
            return await body(box)

    return run(main())


# -- exec semantics ------------------------------------------------------------------------------------------------


def test_exec_semantics_match_the_local_backend(image: str, repo: Path) -> None:
    async def body(box: ContainerSandbox) -> None:
        ok = await box.exec("pwd; cat a.txt", 10)
        assert (ok.stdout, ok.stderr, ok.exit_code, ok.timed_out) == (b"/testbed\noriginal a\n", b"", 0, False)
        failed = await box.exec("echo partial; exit 7", 10)
        assert (failed.stdout, failed.exit_code) == (b"partial\n", 7)
        assert (await box.exec("no-such-command-xyz", 10)).exit_code == 127
        merged = await box.exec("echo out; echo err >&2; echo out2", 10)
        assert (merged.stdout, merged.stderr) == (b"out\nerr\nout2\n", b"")
        separate = await box.exec("echo out; echo err >&2", 10, merge_stderr=False)
        assert (separate.stdout, separate.stderr) == (b"out\n", b"err\n")
        assert (await box.exec("tr a-z A-Z", 10, stdin=b"hello\n")).stdout == b"HELLO\n"
        assert (await box.exec("cat; echo end", 10)).stdout == b"end\n"  # no stdin: EOF at once
        # Shell state carries over: cwd and exports, also after `exit` and a syntax error; plain variables do not.
        assert (await box.exec("cd sub && export FOO='two words' && LOCAL_ONLY=1", 10)).exit_code == 0
        assert (await box.exec('pwd; echo "$FOO [${LOCAL_ONLY-}]"', 10)).stdout == b"/testbed/sub\ntwo words []\n"
        assert (await box.exec("cd /tmp; export FOO=after; exit 3", 10)).exit_code == 3
        broken = await box.exec("if then fi (", 10)
        assert broken.exit_code not in (0, None) and b"syntax error" in broken.stdout
        assert (await box.exec('pwd; echo "$FOO $MY_VAR"', 10)).stdout == b"/tmp\nafter hello world\n"
        assert (await box.exec("unset MY_VAR; cd /testbed", 10)).exit_code == 0
        assert (await box.exec('pwd; echo "[${MY_VAR-unset}]"', 10)).stdout == b"/testbed\n[unset]\n"
        # The repository is the git snapshot of the source.
        status = await box.exec("git status --porcelain && git log --format=%s", 10, merge_stderr=False)
        assert (status.exit_code, status.stdout) == (0, b"uni-agent base snapshot\n"), status.stderr
        # Any bytes through write_file/read_file (stdin is binary-safe), and binary output decodes safely.
        data = bytes(range(256)) * 64 + b"'\"$(touch /tmp/pwned)`x`"
        await write_file(box, "/testbed/new dir/blob.bin", data)
        assert await read_file(box, "/testbed/new dir/blob.bin") == data
        assert (await box.exec("test -e /tmp/pwned || echo safe", 10)).stdout == b"safe\n"
        with pytest.raises(FileNotFoundError):
            await read_file(box, "/testbed/missing.txt")
        binary = await box.exec(r"printf '\xff\xfe\x00abc'", 10)
        assert binary.stdout == b"\xff\xfe\x00abc" and "abc" in binary.output
        # Output past the cap is counted, not kept.
        total = 10_000_000
        huge = await box.exec(f"head -c {total} /dev/zero | tr '\\0' a", 60)
        assert (len(huge.stdout), huge.truncated_bytes, huge.exit_code) == (CAPTURE_LIMIT_BYTES,
                                                                           total - CAPTURE_LIMIT_BYTES, 0)

    with_container(image, body, repo=str(repo), env={"MY_VAR": "hello world"})


def test_a_command_longer_than_argv_allows_runs(image: str, repo: Path) -> None:
    command = "cat > big.txt <<'EOF'\n" + "x" * 300_000 + "\nEOF\nwc -c < big.txt; export AFTER=yes"

    async def body(box: ContainerSandbox) -> tuple[bytes, bytes]:
        big = await box.exec(command, 30)
        return big.stdout, (await box.exec("echo $AFTER", 10)).stdout

    assert with_container(image, body, repo=str(repo)) == (b"300001\n", b"yes\n")


def test_concurrent_execs_run_one_at_a_time_each_its_own_command(image: str, repo: Path) -> None:
    async def body(box: ContainerSandbox) -> list[bytes]:
        return [r.stdout for r in await asyncio.gather(*(box.exec(f"echo {w}", 10) for w in "ABC"))]

    assert with_container(image, body, repo=str(repo)) == [b"A\n", b"B\n", b"C\n"]


# -- timeouts and cancellation -------------------------------------------------------------------------------------


def test_timeout_kills_the_command_and_its_children(image: str, repo: Path) -> None:
    token = f"{os.getpid() % 1000}{int(time.time()) % 1000}"
    child, foreground = f"2900.{token}1", f"2900.{token}2"

    async def body(box: ContainerSandbox) -> None:
        assert (await box.exec("export KEPT=1", 10)).exit_code == 0
        started = time.monotonic()
        result = await box.exec(f"sleep {child} & sleep {foreground}", 1)
        assert result.timed_out is True and result.exit_code is None
        assert 0.9 <= time.monotonic() - started < 10
        for marker in (child, foreground):
            assert wait_until_gone(processes_with(f"sleep\0{marker}".encode()), timeout=5) == [], marker
        after = await box.exec('echo "alive $KEPT"', 10)  # the sandbox and its saved state survive a timeout
        assert (after.stdout, after.exit_code) == (b"alive 1\n", 0)

    with_container(image, body, repo=str(repo))


def test_runtime_timeout_caps_the_requested_timeout(image: str, repo: Path) -> None:
    async def body(box: ContainerSandbox) -> float:
        started = time.monotonic()
        assert (await box.exec("sleep 20", 300)).timed_out
        return time.monotonic() - started

    assert with_container(image, body, repo=str(repo), runtime_timeout=1) < 10


def test_host_kills_the_command_when_the_inner_timeout_does_not(image: str, repo: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # A negative grace makes the host's deadline come first: the host then asks the supervisor to cancel it.
    monkeypatch.setattr(session_module, "HOST_GRACE_S", -18.5)
    marker = f"2901.{os.getpid() % 10000}"

    async def body(box: ContainerSandbox) -> None:
        started = time.monotonic()
        result = await box.exec(f"sleep {marker}", 20)
        assert result.timed_out and result.exit_code is None
        assert time.monotonic() - started < 10  # ended by the host at ~1.5 s, not by `timeout` at 20 s
        assert wait_until_gone(processes_with(f"sleep\0{marker}".encode()), timeout=5) == []
        after = await box.exec("echo ok", 30)  # (the host deadline is 30 - 18.5 s here)
        assert after.stdout == b"ok\n", after

    with_container(image, body, repo=str(repo))


def test_cancelled_exec_kills_the_command_inside_the_container(image: str, repo: Path) -> None:
    marker = f"2902.{os.getpid() % 10000}"

    async def body(box: ContainerSandbox) -> None:
        task = asyncio.create_task(box.exec(f"sleep {marker}", 120))
        deadline = time.monotonic() + 20
        while not processes_with(f"sleep\0{marker}".encode()):
            assert time.monotonic() < deadline, "the command never started"
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The supervisor killed it inside the container: the cancel reached it, not just the host's wait.
        assert wait_until_gone(processes_with(f"sleep\0{marker}".encode()), timeout=5) == []
        assert (await box.exec("echo next", 10)).stdout == b"next\n"

    with_container(image, body, repo=str(repo))


# -- limits, isolation, labels -------------------------------------------------------------------------------------


def test_limits_network_and_labels(image: str, repo: Path) -> None:
    cgroup = ("cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; "
              "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max; "
              "cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us; ulimit -n")
    allocate = "python -c \"x = bytearray(600 * 1024 * 1024); print('allo' + 'cated')\""

    async def body(box: ContainerSandbox) -> None:
        limits = (await box.exec(cgroup, 10)).stdout.decode().split()
        assert limits[0] == str(256 * 1024 * 1024) and limits[1] == "100"
        assert limits[2] in ("50000", "50000 100000") or limits[2:4] == ["50000", "100000"], limits
        assert limits[-1] == "4096"
        interfaces = (await box.exec("cat /proc/net/dev", 10)).output.splitlines()[2:]
        assert [line.split(":")[0].strip() for line in interfaces] == ["lo"]
        oom = await box.exec(allocate, 30)
        assert b"allocated" not in oom.stdout and oom.exit_code == 137 and not oom.timed_out  # the OOM killer
        inspected = subprocess.run(
            ["podman", "inspect", "--format",
             '{{index .Config.Labels "uni-agent.sandbox"}} {{index .Config.Labels "uni-agent.created"}}', box.name],
            capture_output=True, text=True, check=True).stdout.split()
        assert inspected[0] == "1" and abs(int(inspected[1]) - time.time()) < 120
        assert box.name.startswith("uni-agent-limits-")

    with_container(image, body, repo=str(repo), name="limits", memory="256m", cpus=0.5, pids_limit=100)


# -- lifecycle: every path removes the container -------------------------------------------------------------------


def test_close_removes_the_container_and_twice_is_harmless(image: str, repo: Path) -> None:
    async def main() -> None:
        box = config(image, repo=str(repo)).build({}, "closing")
        await box.start()
        assert box.name in labelled_containers()
        await box.close()
        assert box.name not in labelled_containers()
        with pytest.raises(SandboxError):
            await box.exec("true", 10)
        await box.close()

    run(main())


def test_missing_image_with_pull_never_fails_at_once_and_is_not_retried(image: str) -> None:
    agent = AgentConfigs.load(PODMAN_CONFIG).override_all(
        {"env": {"deployment": {"image": "localhost/no-such-image:1", "pull": "never", "start_retries": 3}}})
    started = time.monotonic()
    with pytest.raises(SandboxError, match="not present locally") as caught:
        run(start_sandbox(agent.validated["swe_agent"], "missing-image"))
    assert not isinstance(caught.value, SandboxStartError)  # a config error: no retry
    assert time.monotonic() - started < 10


def test_failed_run_is_retried_then_reported_and_leaves_nothing(image: str, repo: Path) -> None:
    agent = AgentConfigs.load(PODMAN_CONFIG).override_all({"env": {"deployment": {
        "image": image, "pull": "never", "repo": str(repo), "start_retries": 2,
        "run_args": ["--no-such-podman-flag"]}}})
    calls: list[str] = []
    original = ContainerSandbox.start

    async def counting_start(self: ContainerSandbox) -> None:
        calls.append(self.name)
        await original(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ContainerSandbox, "start", counting_start)
        with pytest.raises(SandboxStartError, match="podman run` exit status 125.*no-such-podman-flag"):
            run(start_sandbox(agent.validated["swe_agent"], "bad-run"))
    assert len(calls) == 2 and len(set(calls)) == 2


@pytest.mark.parametrize("when", ["during_run", "after_run"])
def test_cancelled_start_leaves_no_container(image: str, repo: Path, monkeypatch: pytest.MonkeyPatch,
                                             when: str) -> None:
    reached = None
    original_spawn = ContainerSandbox._spawn
    original_call = ContainerSandbox._cli_call

    async def spawn(self: ContainerSandbox, args: Any, with_stdin: bool, **kwargs: Any) -> Any:
        proc = await original_spawn(self, args, with_stdin, **kwargs)
        if args[0] == "run" and when == "during_run":
            reached.set()  # the `podman run` client is running now; the test cancels the start here
        return proc

    async def cli_call(self: ContainerSandbox, args: Any, **kwargs: Any) -> Any:
        result = await original_call(self, args, **kwargs)
        if args[0] == "cp" and when == "after_run":  # the container runs, its supervisor answered
            reached.set()
            await asyncio.Event().wait()  # hold the start here, with the container running
        return result

    monkeypatch.setattr(ContainerSandbox, "_spawn", spawn)
    monkeypatch.setattr(ContainerSandbox, "_cli_call", cli_call)
    agent = AgentConfigs.load(PODMAN_CONFIG).override_all(
        {"env": {"deployment": {"image": image, "pull": "never", "repo": str(repo)}}}).validated["swe_agent"]

    async def main() -> None:
        nonlocal reached
        reached = asyncio.Event()
        task = asyncio.create_task(start_sandbox(agent, "cancelled"))
        await asyncio.wait_for(reached.wait(), 30)
        if when == "after_run":
            assert any(n.startswith("uni-agent-cancelled-") for n in labelled_containers())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())


def test_startup_timeout_fails_the_start_and_leaves_no_container(image: str, repo: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    original_call = ContainerSandbox._cli_call

    async def slow_after_run(self: ContainerSandbox, args: Any, **kwargs: Any) -> Any:
        result = await original_call(self, args, **kwargs)
        if args[0] == "cp":  # the container is running by now
            await asyncio.Event().wait()
        return result

    monkeypatch.setattr(ContainerSandbox, "_cli_call", slow_after_run)
    agent = AgentConfigs.load(PODMAN_CONFIG).override_all({"env": {"deployment": {
        "image": image, "pull": "never", "repo": str(repo), "startup_timeout": 3, "start_retries": 1}}})
    with pytest.raises(SandboxStartError, match="startup_timeout=3"):
        run(start_sandbox(agent.validated["swe_agent"], "slow"))


def test_container_removed_from_outside_is_an_infrastructure_error(image: str, repo: Path) -> None:
    async def body(box: ContainerSandbox) -> None:
        subprocess.run(["podman", "rm", "-f", "-t", "0", box.name], check=True, capture_output=True)
        with pytest.raises(SandboxError, match="gone"):
            await box.exec("echo hi", 10)

    with_container(image, body, repo=str(repo))


CRASHING_OWNER = textwrap.dedent("""
    import asyncio, os, signal, sys
    from uni_agent.sandbox.container import ContainerDeploymentConfig, ContainerSandbox

    async def main():
        box = ContainerSandbox(ContainerDeploymentConfig(type="podman", image=sys.argv[1], pull="never",
                                                         deployment_timeout=float(sys.argv[2])), {}, "crashed")
        await box.start()
        print(box.name, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # dies without closing anything

    asyncio.run(main())
""")


def test_containers_of_a_killed_owner_end_by_themselves_or_are_reaped(image: str) -> None:
    def crash(lifetime: float) -> str:
        done = subprocess.run([sys.executable, "-c", CRASHING_OWNER, image, str(lifetime)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == -9, done.stderr
        return done.stdout.strip().splitlines()[-1]

    short, long = crash(8), crash(3600)  # the short one's lifetime: 8 s + a margin of 8 s
    try:
        check_crashed(image, short, long)
    finally:  # whatever failed above, these two must not outlive the test
        subprocess.run(["podman", "rm", "-f", "-t", "0", short, long], capture_output=True)


def check_crashed(image: str, short: str, long: str) -> None:
    # A live owner's containers are spared by default (this process owns `mine`).
    async def live_owner() -> tuple[list[str], list[str], str]:
        async with container(image, name="mine") as mine:
            return (await list_containers("podman", 0, skip_live_owners=True),
                    await list_containers("podman", 0, skip_live_owners=False), mine.name)

    spared, listed, mine = run(live_owner())
    assert mine in listed and mine not in spared
    # A dead owner's container ends by itself: at once when its death closed the supervisor's stdin (podman
    # forwards the EOF), else at its deployment lifetime (+ a margin), and `--rm` removes it.
    wait_for(lambda: short not in labelled_containers(), 30, f"{short} to end by itself")
    # One that is still there (a long lifetime, the EOF not forwarded) is the reaper's: never younger than asked.
    if long in labelled_containers():
        assert long not in run(list_containers("podman", older_than_s=600))
        assert long in run(reap("podman", older_than_s=0))
    assert long not in labelled_containers()


def test_start_cap_holds_across_concurrent_starts(image: str, repo: Path) -> None:
    async def main() -> int:
        boxes = [config(image, repo=str(repo), max_starting=1).build({}, f"cap{i}") for i in range(3)]
        try:
            await asyncio.gather(*(b.start() for b in boxes))
            return start_limits(("container", "podman"), 1).cap.max_held
        finally:
            await asyncio.gather(*(b.close() for b in boxes))

    assert run(main()) == 1


def test_docker_flavour_through_a_cli_shim(image: str, repo: Path, tmp_path: Path) -> None:
    """No Docker engine here; podman accepts docker's command lines, so a shim that logs and forwards checks ours."""
    calls = tmp_path / "calls.log"
    shim = tmp_path / "docker"
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\nexec podman "$@"\n')
    shim.chmod(0o755)

    async def body(box: ContainerSandbox) -> bytes:
        return (await box.exec("cat a.txt", 10)).stdout

    assert with_container(image, body, repo=str(repo), type="docker", cli=str(shim)) == b"original a\n"
    lines = calls.read_text().splitlines()
    run_line = next(line for line in lines if line.startswith("run "))
    assert "--runtime runc" in run_line and "--network none" in run_line and "--pull never" in run_line
    assert any(line.startswith("rm -f uni-agent-t-") for line in lines)  # docker's rm has no -t


# -- verification inside a container -------------------------------------------------------------------------------


def test_bundled_tasks_verify_gold_and_empty_patches_in_podman(image: str) -> None:
    tasks = sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "instance.json").exists())[:2]
    agents = AgentConfigs.load(PODMAN_CONFIG)

    def agent_for(task: str):
        instance = load_instance(BUNDLED_DIR / task)
        tools_kwargs = {
            "env": {"deployment": {"type": "podman", "image": image, "pull": "never", "repo": f"bundled:{task}"}},
            "reward": {"name": "swe_local", "metadata": {
                "test_patch": instance["test_patch"], "FAIL_TO_PASS": instance["FAIL_TO_PASS"],
                "PASS_TO_PASS": instance["PASS_TO_PASS"]}},
        }
        return agents.for_row("swe_agent", tools_kwargs, f"task {task}"), instance

    async def main() -> list[tuple[str, str, Any]]:
        jobs = []
        for task in tasks:
            agent, instance = agent_for(task)
            assert agent.env.deployment.type == "podman"
            jobs += [(task, "gold", verify_patch(agent, instance["patch"], f"{task}-gold")),
                     (task, "empty", verify_patch(agent, "", f"{task}-empty"))]
        outcomes = await asyncio.gather(*(job for _, _, job in jobs))
        return [(task, kind, outcome) for (task, kind, _), outcome in zip(jobs, outcomes, strict=True)]

    for task, kind, outcome in run(main()):
        if kind == "gold":
            assert (outcome.reward, outcome.status) == (1.0, "resolved"), (task, outcome.error, outcome.log_tail)
            assert outcome.fail_to_pass and set(outcome.fail_to_pass.values()) == {"PASSED"}
        else:
            assert (outcome.reward, outcome.status) == (0.0, "unresolved"), (task, outcome.error, outcome.log_tail)
            assert outcome.patch_applied


def test_an_oom_killed_command_leaves_no_file_in_the_working_directory(image: str, repo: Path) -> None:
    async def body(box: ContainerSandbox) -> int | None:
        return (await box.exec("python -c \"x = bytearray(600 * 1024 * 1024)\"", 30)).exit_code

    before = set(Path.cwd().iterdir())
    assert with_container(image, body, memory="256m") == 137
    assert set(Path.cwd().iterdir()) == before  # conmon writes `oom` into its cwd; ours is the temp dir
