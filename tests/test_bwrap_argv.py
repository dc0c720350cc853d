"""The bubblewrap command line (uni_agent.sandbox.bwrap): a shell runs between bwrap and the supervisor only where it
has a ulimit to set (each start without it saves bash's ~2 ms of CPU). The sandboxes that run through both shapes
are in test_sandbox_local.py (the fork bomb test: a pids cgroup as root, `ulimit -u` otherwise)."""

from pathlib import Path

from uni_agent.sandbox.bwrap import Mounts, bwrap_argv


def _argv(tmp_path: Path, shell_limits: str) -> list[str]:
    dirs = {name: tmp_path / name for name in ("tmp", "home", "state")}
    for path in dirs.values():
        path.mkdir(exist_ok=True)
    mounts = Mounts(root=None, repo=None, tmp=dirs["tmp"], home=dirs["home"], state=dirs["state"])
    return bwrap_argv(mounts, "/testbed", "/run/uni-agent", None, network=False, shell_limits=shell_limits)


def _after_bwrap_options(argv: list[str]) -> list[str]:
    """What bwrap runs: everything after its last --setenv pair."""
    last = max(i for i, arg in enumerate(argv) if arg == "--setenv")
    return argv[last + 3:]


def test_no_limits_runs_the_supervisor_straight_from_bwrap(tmp_path):
    command = _after_bwrap_options(_argv(tmp_path, ""))
    assert "bash" not in command
    assert command[1:3] == ["-I", "-S"]  # python3 -I -S <the supervisor> <state dir> <lifetime>
    assert "/run/uni-agent" in command


def test_a_ulimit_goes_through_one_shell_before_the_supervisor(tmp_path):
    command = _after_bwrap_options(_argv(tmp_path, "ulimit -u 64 2>/dev/null;"))
    assert command[:4] == ["bash", "--noprofile", "--norc", "-c"]
    assert command[4] == 'ulimit -u 64 2>/dev/null; exec "$@"'
    assert command[5] == "limits" and command[7:9] == ["-I", "-S"]  # then the same supervisor command line
