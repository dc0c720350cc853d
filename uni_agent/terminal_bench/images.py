"""A task's container image, built from its environment/Dockerfile with the podman (or docker) CLI.

The tag is `localhost/uni-agent-tb-<task>:<hash>`, where the hash covers every file of environment/ and the build
arguments, so a changed task gets a new image and an unchanged one is built once (a rebuild is skipped when the tag
exists). Rows name the tag with `pull: never`: a locally built image is never in a registry, so a missing one is a
clear error at sandbox start instead of a pull that cannot succeed.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..config import ConfigError
from .classic_dockerfile import prepare_build_context
from .task import LoadedTask

TAG_PREFIX = "localhost/uni-agent-tb-"
BUILD_LOG_TAIL = 3000


class ImageBuildError(ConfigError):
    """`build` failed or ran past the task's build_timeout_sec; the message names the task and shows the log tail."""


def image_tag(task: LoadedTask, build_args: dict[str, str]) -> str:
    digest = hashlib.sha256()
    context = task.folder / "environment"
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(path.relative_to(context).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for key in sorted(build_args):
        digest.update(f"--build-arg {key}={build_args[key]}\0".encode())
    name = re.sub(r"[^a-z0-9_.-]+", "-", task.task_id.lower()).strip("-.") or "task"
    return f"{TAG_PREFIX}{name}:{digest.hexdigest()[:12]}"


def _global_args(cli: str, runtime: str | None) -> list[str]:
    # podman takes the OCI runtime as a global flag; Debian's podman needs runc (crun fails there), also for RUN steps.
    return ["--runtime", runtime] if runtime and Path(cli).name == "podman" else []


def image_exists(tag: str, cli: str = "podman") -> bool:
    done = subprocess.run([cli, "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True)
    return done.returncode == 0


def build_image(task: LoadedTask, tag: str, cli: str = "podman", build_args: dict[str, str] | None = None,
                network: str | None = None, runtime: str | None = "runc") -> bool:
    """Build the task's image as `tag` unless it exists; True when it was built now. Bounded by build_timeout_sec."""
    if shutil.which(cli) is None:
        raise ImageBuildError(f"task {task.task_id}: the {cli!r} CLI is not installed, so its image cannot be built")
    if image_exists(tag, cli):
        return False
    timeout = task.config.environment.build_timeout_sec
    with tempfile.TemporaryDirectory(prefix="uni-agent-build-") as scratch:
        # A Dockerfile with heredocs is built from a copy of the context where they are files (dockerfile.py): buildah
        # before 1.33 (Debian 12's podman 4.3) reads heredoc bodies as instructions.
        context, dockerfile = prepare_build_context(task.folder / "environment", Path(scratch), build_args)
        argv = [cli, *_global_args(cli, runtime), "build", "-t", tag, "-f", str(dockerfile)]
        for key, value in sorted((build_args or {}).items()):
            argv += ["--build-arg", f"{key}={value}"]
        if network:
            argv += ["--network", network]
        try:
            done = subprocess.run([*argv, str(context)], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ImageBuildError(f"task {task.task_id}: the image build ran past build_timeout_sec={timeout:g}") \
                from None
    if done.returncode != 0:
        log = (done.stdout + done.stderr)[-BUILD_LOG_TAIL:]
        raise ImageBuildError(f"task {task.task_id}: {cli} build failed (exit {done.returncode}):\n{log}")
    return True
