"""The container image the podman tests run on, built here without any registry: debootstrap → tar → `podman import`.

Debian bookworm (minbase) with python3, python-is-python3, git and python3-pytest, which is what the bundled tasks
need. The image is cached by its tag; the tag carries a hash of the recipe, so a changed recipe builds a new image
and an unchanged one is reused (a rerun costs one `podman image exists`). The tools (podman, runc, catatonit,
debootstrap) are installed with apt when missing, so a fresh CI machine works. Without root neither the tools can be
installed nor the image built (debootstrap needs root; rootless podman keeps images per user): tests that need the
image get it through `image_for_tests`, which skips them then and says why, except under CI (CI=true), where they
fail, as they do wherever root could have built it.

Run as a script to build (or find) the image and print its tag: `python tests/container_image.py`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "bookworm"
PACKAGES = ("python3", "python-is-python3", "git", "python3-pytest", "ca-certificates")
# command → apt package. catatonit is the init that `--init` runs (only a Recommends of Debian's podman).
TOOLS = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap", "catatonit": "catatonit"}
IMAGE_REPO = "localhost/uni-agent-test"
LABEL = "uni-agent.test-image"
BUILD_LOG = Path(tempfile.gettempdir()) / "uni-agent-test-image-build.log"


class ImageUnavailable(RuntimeError):
    """The tools could not be installed or the image could not be built; the message says why."""

    def __init__(self, message: str, *, needs_root: bool = False):
        super().__init__(message)
        self.needs_root = needs_root  # only root could have provided it (not a fault of the machine or recipe)


def recipe_tag() -> str:
    recipe = f"{SUITE}|minbase|{','.join(PACKAGES)}|v1"
    return f"{IMAGE_REPO}:{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"


def _which(cmd: str) -> str | None:
    # runc and debootstrap live in /usr/sbin, off an ordinary user's PATH (podman finds runc there itself).
    return shutil.which(cmd, path=f"{os.environ.get('PATH', os.defpath)}:/usr/local/sbin:/usr/sbin:/sbin")


def ensure_tools() -> None:
    missing = [pkg for cmd, pkg in TOOLS.items() if _which(cmd) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        raise ImageUnavailable(f"{', '.join(missing)} not installed and not root "
                               f"(apt-get install -y {' '.join(missing)})", needs_root=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise ImageUnavailable(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")
    still = [cmd for cmd in TOOLS if _which(cmd) is None]
    if still:
        raise ImageUnavailable(f"still missing after apt-get install: {still}")


def apt_mirror() -> str | None:
    """The Debian mirror apt on this machine already uses (debootstrap's own default otherwise)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        text = path.read_text(errors="replace")
        for stanza in text.split("\n\n"):
            if re.search(rf"^Suites:.*\b{SUITE}\b", stanza, re.M) and "security" not in stanza:
                match = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if match:
                    return match.group(1)
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                return parts[1]
    return None


def image_exists(tag: str) -> bool:
    return subprocess.run(["podman", "image", "exists", tag], capture_output=True).returncode == 0


def ensure_image() -> tuple[str, float]:
    """The image's tag and the seconds spent building it (0.0 when it was cached). Safe to call concurrently."""
    ensure_tools()
    tag = recipe_tag()
    if image_exists(tag):
        return tag, 0.0
    if os.geteuid() != 0:
        raise ImageUnavailable(
            f"{tag} is not in this user's podman storage and building it needs root (debootstrap); root can "
            f"build it (python tests/container_image.py) and hand it over: podman save {tag} | runuser -u "
            f"USER -- podman load", needs_root=True)
    lock_path = Path(tempfile.gettempdir()) / "uni-agent-test-image.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same tag
        if image_exists(tag):
            return tag, 0.0
        started = time.monotonic()
        _build(tag)
        return tag, time.monotonic() - started


def _build(tag: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="uni-agent-image-"))
    rootfs = work / "rootfs"
    try:
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs)]
        mirror = apt_mirror()
        if mirror:
            argv.append(mirror)
        with open(BUILD_LOG, "w") as log:
            done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=1200)
        if done.returncode != 0:
            tail = BUILD_LOG.read_text(errors="replace")[-3000:]
            raise ImageUnavailable(f"debootstrap failed (exit {done.returncode}; log {BUILD_LOG}):\n{tail}")
        # Trim what a test image does not need: apt lists and caches, docs.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            shutil.rmtree(rootfs / sub, ignore_errors=True)
        tarball = work / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."], check=True,
                       capture_output=True)
        shutil.rmtree(rootfs, ignore_errors=True)
        imported = subprocess.run(
            ["podman", "import", "--change", "CMD=/bin/bash", "--change", f"LABEL={LABEL}=1", str(tarball), tag],
            capture_output=True, text=True, timeout=600,
        )
        if imported.returncode != 0:
            raise ImageUnavailable(f"podman import failed: {imported.stderr[-2000:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def image_for_tests() -> tuple[str, float]:
    """ensure_image() for a test: a skip that says why where only root could provide the image and this is not root
    (nor CI); a failure wherever it could have been built (tests/run.sh's machine can build it)."""
    import pytest

    try:
        return ensure_image()
    except ImageUnavailable as exc:
        if exc.needs_root and os.geteuid() != 0 and os.environ.get("CI") != "true":
            pytest.skip(f"the podman test image needs root here: {exc}")
        pytest.fail(f"the podman test image is unavailable: {exc}")


if __name__ == "__main__":
    try:
        image, seconds = ensure_image()
    except ImageUnavailable as exc:
        sys.exit(str(exc))
    print(image, f"built in {seconds:.1f}s" if seconds else "(cached)")
