"""A sandbox's copy-on-write overlays are mounted `volatile` (no sync of a layer that is thrown away), and where the
kernel refuses the option (before Linux 5.10) they are mounted plainly: real sandboxes for the first, the two mount
paths' fallbacks with the refusal made up (this machine's kernel has the option)."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_sandbox_local import repo, run, sandbox  # noqa: F401 - repo: a fixture

from uni_agent.sandbox import fork_server_main
from uni_agent.sandbox.overlay import DURABLE_SETUP_SCRIPT, SETUP_SCRIPT

WORKSPACE_OVERLAY = "grep ' /testbed .* - overlay ' /proc/self/mountinfo"


@pytest.mark.parametrize("launcher", ["fork_server", "bwrap"])
def test_the_workspace_overlay_is_volatile_and_still_copy_on_write(repo: Path, launcher: str) -> None:  # noqa: F811
    async def main() -> tuple[bool, str, str, str]:
        async with sandbox(repo, launcher=launcher) as box:
            mounted = (await box.exec(WORKSPACE_OVERLAY, 10)).output
            # fsync through the overlay still succeeds (it is skipped, not refused)
            synced = await box.exec("python3 -c \"import os; f = os.open('s.txt', os.O_WRONLY | os.O_CREAT); "
                                    "os.write(f, b'kept'); os.fsync(f); os.close(f)\" && cat s.txt", 10)
            return box._fork_server is not None, mounted, synced.output, (repo / "a.txt").read_text()

    in_fork_server, mounted, synced, source = run(main())
    assert in_fork_server is (launcher == "fork_server")
    options = mounted.strip().rsplit(" ", 1)[-1].split(",")
    assert {"volatile", "fsync=volatile"} & set(options), mounted  # newer kernels (6.x) say fsync=volatile
    assert synced == "kept" and source == "original a\n"


def fake_mount(tmp_path: Path, refuses: str) -> tuple[dict[str, str], Path]:
    """A `mount` first on PATH that logs its -o argument and fails (as mount(8) does) when it contains `refuses`."""
    bin_dir, log = tmp_path / "bin", tmp_path / "mount.log"
    bin_dir.mkdir()
    script = bin_dir / "mount"
    script.write_text(f'#!/bin/sh\necho "$5" >> {log}\ncase "$5" in *{refuses}*) echo refused >&2; exit 32;; esac\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def run_setup(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script, "sh", "", "--", "L", "U", "W", "M", "--", "echo", "ran"],
                          env=env, capture_output=True, text=True, timeout=10)


def test_the_setup_script_mounts_plainly_where_volatile_is_refused(tmp_path: Path) -> None:
    env, log = fake_mount(tmp_path, refuses="volatile")
    done = run_setup(SETUP_SCRIPT, env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ran\n", "")  # the refusal is not shown
    assert log.read_text().splitlines() == ["lowerdir=L,upperdir=U,workdir=W,volatile",
                                            "lowerdir=L,upperdir=U,workdir=W"]


def test_the_setup_script_stops_when_the_plain_mount_fails_too(tmp_path: Path) -> None:
    env, log = fake_mount(tmp_path, refuses="lowerdir")
    done = run_setup(SETUP_SCRIPT, env)
    assert done.returncode == 1 and done.stdout == "" and done.stderr == "refused\n"  # the plain mount's error
    assert len(log.read_text().splitlines()) == 2


def test_the_build_steps_mount_is_never_volatile(tmp_path: Path) -> None:
    """uni_agent.envs' build steps may mount their scratch dirs again, which a volatile work dir refuses."""
    env, log = fake_mount(tmp_path, refuses="nothing-refused")
    assert run_setup(DURABLE_SETUP_SCRIPT, env).stdout == "ran\n"
    assert log.read_text().splitlines() == ["lowerdir=L,upperdir=U,workdir=W"]


@pytest.mark.parametrize("refusal", [errno.EINVAL, errno.EPERM])
def test_the_fork_server_mounts_plainly_only_where_volatile_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                                       refusal: int) -> None:
    calls: list[tuple[Any, ...]] = []

    def mount(source: str, target: str, fstype: str, flags: int, data: str | None = None) -> None:
        calls.append((source, target, fstype, data))
        if data and data.endswith(",volatile"):
            raise OSError(refusal, "mount overlay on " + target)

    monkeypatch.setattr(fork_server_main, "_mount", mount)
    plain = ("overlay", "/m", "overlay", "lowerdir=/l,upperdir=/u,workdir=/w")
    if refusal == errno.EINVAL:  # the option unknown to the kernel
        fork_server_main._mount_overlay("/l", "/u", "/w", "/m")
        assert calls == [plain[:3] + (plain[3] + ",volatile",), plain]
    else:  # any other failure is the sandbox's start failing, as before
        with pytest.raises(OSError) as raised:
            fork_server_main._mount_overlay("/l", "/u", "/w", "/m")
        assert raised.value.errno == errno.EPERM and len(calls) == 1
