"""Local sandboxes as ordinary users on a shared machine, for real: users created for the test (tests/unprivileged.py;
skipped with the reason where the tests do not run as root), bubblewrap, user namespaces, overlayfs, and images built
by podman and unpacked by umoci, two users at once where it matters.

- the sandbox root: per user, 0700, refused when it is a symlink, someone else's, or open to others;
- privacy: one user cannot list, read (state.sh holds the exported secrets) or rename another's live sandbox;
- rootless image sandboxes: an overlay in the user's own namespace (no copy: a few KiB of disk per sandbox), the
  image's owners and User (with subordinate ids), HOME, /run made when the image lacks it; without subordinate ids,
  a clear error (not a retried start) for an image whose User is not root.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from container_image import image_for_tests
from unprivileged import User, ensure_user, popen_as, remove_users, run_python_as, shared_dir

from uni_agent.sandbox import SandboxError, SandboxStartError
from uni_agent.sandbox.local import LocalDeploymentConfig
from uni_agent.sandbox.private_dir import UnsafeDirectory, make_private_subdir, sandbox_root

USERS = ("ua-test-a", "ua-test-b")
NO_SUBIDS = "ua-test-nosub"
TASK = "bundled:" + sorted(p.name for p in (Path(__file__).resolve().parent.parent / "uni_agent" / "tasks" /
                                            "bundled").iterdir() if (p / "instance.json").exists())[0]

# An image with what a rootless unpack gets wrong: a file of another owner, a User that is not root (with a home),
# and (the `norun` tag: the same, with /run removed by umoci) no /run, where the state dir is bound.
IMAGE = """\
FROM {base}
RUN useradd -u 1234 -m agent && mkdir /work && chown agent /work && echo x > /opt/owned && chown 1234:2345 /opt/owned
WORKDIR /work
USER agent
"""


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[User, User]]:
    a, b = ensure_user(USERS[0]), ensure_user(USERS[1])
    yield a, b
    remove_users(USERS)


@pytest.fixture(scope="module")
def images() -> Iterator[dict[str, str]]:
    """References every user can read: the test image (User root) and the derived one, with and without /run."""
    base = image_for_tests()[0]
    out = shared_dir("uni-agent-rootless-images.")
    (out / "Containerfile").write_text(IMAGE.format(base=base))
    tag = "localhost/uni-agent-test-rootless:v1"
    quiet: dict[str, Any] = {"check": True, "capture_output": True, "timeout": 600}
    subprocess.run(["podman", "--runtime", "runc", "build", "--network", "none", "-t", tag, "-f",
                    str(out / "Containerfile"), str(out)], **quiet)
    subprocess.run(["podman", "save", "--format", "oci-dir", "-o", str(out / "derived"), tag], **quiet)
    subprocess.run(["podman", "save", "--format", "oci-dir", "-o", str(out / "base"), base], **quiet)
    bundle = out / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{out / 'derived'}:{tag}", str(bundle)], **quiet)
    shutil.rmtree(bundle / "rootfs" / "run")
    subprocess.run(["umoci", "repack", "--image", f"{out / 'derived'}:norun", str(bundle)], **quiet)
    shutil.rmtree(bundle)
    subprocess.run(["chmod", "-R", "a+rX", str(out)], **quiet)
    yield {"base": f"oci:{out / 'base'}", "user": f"oci:{out / 'derived'}:norun"}
    shutil.rmtree(out, ignore_errors=True)


def run_json(user: User, code: str, timeout: float = 300) -> dict[str, Any]:
    """Run a snippet as `user`; its last line of output is JSON."""
    done = run_python_as(user, textwrap.dedent(code), timeout=timeout)
    assert done.returncode == 0, f"as {user.name}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the sandbox root -------------------------------------------------------------------------------------------
def test_the_default_root_is_per_user_and_private(users: tuple[User, User]) -> None:
    code = """
        import json, os
        from uni_agent.sandbox.private_dir import sandbox_root
        root = sandbox_root()
        print(json.dumps({"root": str(root), "modes": [oct(os.stat(p).st_mode & 0o777) for p in (root, root.parent)],
                          "owners": [os.stat(p).st_uid for p in (root, root.parent)]}))
    """
    seen = [run_json(user, code) for user in users]
    for user, found in zip(users, seen, strict=True):
        assert found["root"] == f"/tmp/uni-agent-{user.uid}/sandboxes"
        assert found["modes"] == ["0o700", "0o700"] and found["owners"] == [user.uid, user.uid]


def test_a_root_that_is_a_symlink_someone_elses_or_open_is_refused(users: tuple[User, User], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    cases = {"link": "is a symbolic link", "foreign": f"owned by {users[1].name}", "open": "writable by group"}
    (tmp_path / "foreign").mkdir(mode=0o700)
    os.chown(tmp_path / "foreign", users[1].uid, users[1].gid)
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o770)
    for name, message in cases.items():
        monkeypatch.setenv("UNI_AGENT_SANDBOX_ROOT", str(tmp_path / name))
        with pytest.raises(UnsafeDirectory, match=message) as refused:
            sandbox_root()
        assert str(tmp_path / name) in str(refused.value) and "UNI_AGENT_SANDBOX_ROOT" in str(refused.value)

    # a start under such a root is a SandboxError that the start retries leave alone
    async def start() -> None:
        async with LocalDeploymentConfig(repo=TASK).build({}, "refused"):
            pass

    with pytest.raises(SandboxError, match="writable by group") as start_refused:
        asyncio.run(start())
    assert not isinstance(start_refused.value, (SandboxStartError, OSError))

    # a root swapped for a symlink after it was checked cannot redirect a new sandbox dir
    with pytest.raises(UnsafeDirectory, match="cannot be opened"):
        make_private_subdir(tmp_path / "link", "sbx-1", ("state",), {})
    assert list(real.iterdir()) == []

    readable = tmp_path / "readable"
    readable.mkdir(mode=0o755)
    readable.chmod(0o755)
    monkeypatch.setenv("UNI_AGENT_SANDBOX_ROOT", str(readable))
    assert sandbox_root() == readable and readable.stat().st_mode & 0o777 == 0o700  # ours: tightened


def test_a_default_root_squatted_by_another_user_is_refused(users: tuple[User, User]) -> None:
    a, b = users
    squatted = Path(f"/tmp/uni-agent-{a.uid}")
    shutil.rmtree(squatted, ignore_errors=True)
    try:
        run_json(b, f"import os; os.mkdir({str(squatted)!r}, 0o777); os.chmod({str(squatted)!r}, 0o777); print('{{}}')")
        found = run_json(a, """
            import json
            from uni_agent.sandbox.private_dir import sandbox_root
            try:
                sandbox_root()
                print(json.dumps({"error": None}))
            except Exception as exc:
                print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        """)
        assert found["error"] is not None and found["error"].startswith("UnsafeDirectory")
        assert str(squatted) in found["error"] and f"owned by {b.name}" in found["error"]
    finally:
        shutil.rmtree(squatted, ignore_errors=True)


# -- privacy of live sandboxes ----------------------------------------------------------------------------------
HOLDER = """
import asyncio, json, sys
from uni_agent.sandbox.local import LocalDeploymentConfig

async def main():
    async with LocalDeploymentConfig(repo={task!r}, launcher={launcher!r}).build({{"UA_SECRET": {secret!r}}},
                                                                               "holder") as box:
        print(json.dumps({{"dir": str(box.dir)}}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # while the other user tries its luck
        result = await box.exec("echo $UA_SECRET; ls", 30)
        print(json.dumps({{"output": result.output}}), flush=True)

asyncio.run(main())
"""

PRYER = """
import asyncio, json, os
from uni_agent.sandbox.local import LocalDeploymentConfig

target = {target!r}
tries = {{
    "list its root": lambda: os.listdir(os.path.dirname(target)),
    "list its dir": lambda: os.listdir(target),
    "read its state": lambda: open(os.path.join(target, "state", "state.sh")).read(),
    "rename its dir": lambda: os.rename(target, target + ".moved"),
    "list its user's dir": lambda: os.listdir(os.path.dirname(os.path.dirname(target))),
}}

async def main():
    outcomes = {{}}
    async with LocalDeploymentConfig(repo={task!r}).build({{}}, "pryer") as own:  # both live at once
        for what, attempt in tries.items():
            try:
                attempt()
                outcomes[what] = "done"
            except OSError as exc:
                outcomes[what] = type(exc).__name__
        outcomes["own sandbox"] = (await own.exec("echo works", 30)).output.strip()
    print(json.dumps(outcomes))

asyncio.run(main())
"""


@pytest.mark.parametrize("launcher", ["bwrap", "fork_server"])
def test_a_user_cannot_read_or_move_another_users_live_sandbox(users: tuple[User, User], launcher: str) -> None:
    a, b = users
    secret = "hunter2-" + os.urandom(4).hex()
    holder = popen_as(a, [sys.executable, "-c", HOLDER.format(task=TASK, secret=secret, launcher=launcher)])
    try:
        line = " "
        while line and not line.startswith("{"):  # past any log line
            line = holder.stdout.readline()  # type: ignore[union-attr]
        assert line, holder.stderr.read()  # type: ignore[union-attr]
        target = json.loads(line)["dir"]
        state = Path(target, "state")  # what there is to steal (root can look)
        if launcher == "bwrap":
            assert secret in (state / "state.sh").read_text()
        else:  # the fork server's sandbox keeps its state on its own tmpfs: nothing on disk
            assert list(state.iterdir()) == []
        outcomes = run_json(b, PRYER.format(target=target, task=TASK))
    finally:
        out, err = holder.communicate("\n", timeout=120)
    assert outcomes == {"list its root": "PermissionError", "list its dir": "PermissionError",
                        "read its state": "PermissionError", "rename its dir": "PermissionError",
                        "list its user's dir": "PermissionError", "own sandbox": "works"}
    assert holder.returncode == 0, err
    assert secret in json.loads(out.strip().splitlines()[-1])["output"]  # untouched, it still works
    assert not Path(target).exists()


# -- image sandboxes without root -------------------------------------------------------------------------------
IMAGE_RUN = """
import asyncio, json, os, subprocess, time
from uni_agent.sandbox.local import LocalDeploymentConfig, reap_orphaned_sandboxes, sandbox_root
from uni_agent.sandbox.userns import user_namespace

COMMANDS = {{
    "ids": "id -u; id -g; echo $HOME",
    "owners": "stat -c %u:%g /opt/owned /work /home/agent /usr/bin/env",
    "run": "stat -c %a /run; test -w /run/uni-agent && echo writable",
    "root_fs": "grep -c ' / / .* - overlay ' /proc/self/mountinfo; grep ' / / .* - overlay ' /proc/self/mountinfo | "
               "grep -c volatile",
    "write": "echo mine > /work/new && echo changed > /opt/owned && stat -c %u /work/new",
}}

def disk_bytes(path):
    # inside the namespace: the caller cannot enter what the image's User owns
    done = subprocess.run(user_namespace().argv(mount=False) + ["du", "-s", "-B1", str(path)], capture_output=True,
                          text=True, check=True)
    return int(done.stdout.split()[0])

async def main():
    found = {{}}
    async with LocalDeploymentConfig(image={image!r}).build({{}}, "warm"):
        pass  # the first start unpacks the image into this user's cache
    box = LocalDeploymentConfig(image={image!r}).build({{}}, "img")
    started = time.perf_counter()
    async with box:
        found["start_s"] = time.perf_counter() - started
        found["overlay"] = box.use_overlay
        for key, command in COMMANDS.items():
            found[key] = (await box.exec(command, 30)).output.split()
        found["sandbox_bytes"] = disk_bytes(box.dir)
        found["image_bytes"] = disk_bytes(box._lease.image.rootfs)
        found["upper"] = sorted(os.listdir(box.dir / "root-upper" / "opt"))
        found["lower"] = (box._lease.image.rootfs / "opt" / "owned").read_text()
    root = sandbox_root()
    found["left"] = os.listdir(root)
    # an orphan (its owner died) holding files of the image's User is reaped too
    orphan = root / "orphan-1"
    orphan.mkdir(mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (orphan / "owner.pid").write_text(str(dead.pid))
    subprocess.run(user_namespace().argv(mount=False) + ["sh", "-c", f"mkdir -m 700 {{orphan}}/u && touch "
                   f"{{orphan}}/u/f && chown -R 1234:1234 {{orphan}}/u"], check=True)
    found["reaped"] = [str(p) for p in reap_orphaned_sandboxes(root)] == [str(orphan)] and not orphan.exists()
    print(json.dumps(found))

asyncio.run(main())
"""


def test_a_rootless_image_sandbox_is_an_overlay_with_the_images_owners_user_and_run(
        users: tuple[User, User], images: dict[str, str]) -> None:
    a, _ = users
    found = run_json(a, IMAGE_RUN.format(image=images["user"]), timeout=600)
    print(f"rootless start with the image cached: {found['start_s']:.3f} s; sandbox "
          f"{found['sandbox_bytes']} bytes on disk, the image {found['image_bytes'] / 2**20:.0f} MiB")
    assert found["overlay"] is True and found["root_fs"] == ["1", "1"]  # `/` an overlay (nothing copied), volatile
    assert found["sandbox_bytes"] < 1 << 20 < found["image_bytes"] // 100
    assert found["ids"] == ["1234", "1234", "/home/agent"]  # the image's User, its home
    assert found["owners"] == ["1234:2345", "1234:0", "1234:1234", "0:0"]  # as in the image (`chown agent /work`)
    assert found["run"] == ["755", "writable"]  # made for the image, which has no /run
    assert found["write"] == ["1234"]
    assert found["upper"] == ["owned"] and found["lower"] == "x\n"  # writes land in the sandbox's own layer
    assert found["left"] == [] and found["reaped"] is True  # files of the User's uid removed as well


def test_without_subordinate_ids_an_image_runs_as_root_and_a_user_image_is_a_clear_error(
        images: dict[str, str]) -> None:
    user = ensure_user(NO_SUBIDS, subordinate_ids=False)
    try:
        found = run_json(user, f"""
            import asyncio, json
            from uni_agent.sandbox.local import LocalDeploymentConfig

            async def main():
                found = {{}}
                async with LocalDeploymentConfig(image={images["base"]!r}).build({{}}, "base") as box:
                    found["overlay"] = box.use_overlay
                    found["ids"] = (await box.exec("id -u; echo $HOME; stat -c %u /usr/bin/env", 30)).output.split()
                try:
                    async with LocalDeploymentConfig(image={images["user"]!r}).build({{}}, "user"):
                        found["error"] = None
                except Exception as exc:
                    found["error"] = [type(exc).__name__, str(exc)]
                print(json.dumps(found))

            asyncio.run(main())
        """, timeout=600)
    finally:
        remove_users([NO_SUBIDS])
    assert found["overlay"] is True and found["ids"] == ["0", "/root", "0"]
    kind, message = found["error"]
    assert kind == "SandboxError"  # not SandboxStartError: a retry cannot help
    assert "User 1234:1234" in message and "subordinate ids" in message and "uidmap" in message


def test_a_rootless_repo_sandbox_is_an_overlay_too(users: tuple[User, User]) -> None:
    """The host-root sandbox (no image): the task repo copy-on-write at /testbed, not copied; the patch as usual."""
    found = run_json(users[1], f"""
        import asyncio, json
        from uni_agent.sandbox.local import LocalDeploymentConfig
        from uni_agent.sandbox.start import workspace_patch

        async def main():
            async with LocalDeploymentConfig(repo={TASK!r}).build({{}}, "repo") as box:
                found = {{"overlay": box.use_overlay}}
                found["inside"] = (await box.exec("id -u; echo $HOME; grep -c ' /testbed .* - overlay ' "
                                                  "/proc/self/mountinfo; grep ' /testbed .* - overlay ' "
                                                  "/proc/self/mountinfo | grep -c volatile; "
                                                  "echo change >> README.md", 30)).output.split()
                found["patch"] = await workspace_patch(box)
            print(json.dumps(found))

        asyncio.run(main())
    """)
    assert found["overlay"] is True and found["inside"] == ["0", "/root", "1", "1"]  # the overlay volatile, too
    assert "+change" in found["patch"]


def test_as_root_an_image_without_run_runs_as_its_user(images: dict[str, str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """bwrap made the missing /run for the state dir mode 0700, closed to the image's User: it failed as root too."""
    monkeypatch.setenv("UNI_AGENT_IMAGE_CACHE", str(tmp_path / "cache"))

    async def main() -> list[str]:
        async with LocalDeploymentConfig(image=images["user"]).build({}, "norun") as box:
            return (await box.exec("id -u; stat -c %a /run; stat -c %u:%g /opt/owned", 30)).output.split()

    assert asyncio.run(main()) == ["1234", "755", "1234:2345"]
