"""Prepared environments for harness programs: a venv made once on this host, mounted read-only into every sandbox.

    uni-agent harness prepare mini-swe-agent [--dir DIR] [--python /usr/bin/python3]

prints the venv's directory; the agent config mounts it (examples/harness/mini_swe_agent.yaml):

    harness:
      mounts: {/opt/mini-swe-agent: ~/.cache/uni-agent/harness/mini-swe-agent-2.4.6}
      command: /opt/mini-swe-agent/bin/python -m minisweagent.run.mini ...

The program runs inside the sandbox with the sandbox's network off, so everything it needs is installed here, once
(pip, from the package index this host uses). The venv runs on the Python that made it, through its `bin/python`
link: on local sandboxes over the host's root that is the host's own; in an image it must be the same Python at the
same path (Debian 12's /usr/bin/python3 for a bookworm image), else make the venv with the image's Python (run this
module in a container of that image) or install the program into the image. It is started as `bin/python -m ...`
rather than through its console scripts, whose first line names the host path of the venv.

Made under ~/.cache/uni-agent/harness/ (UNI_AGENT_CACHE_DIR), the user's own; a venv is used only once its
completion marker is written, so an interrupted install is made again, and concurrent prepares wait for each other.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..private_dirs import cache_dir

MINI_SWE_AGENT_VERSION = "2.4.6"  # as pyproject's `bench` extra pins it
RECIPES: dict[str, list[str]] = {
    "mini-swe-agent": [f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}"],
}
VERSIONS = {"mini-swe-agent": MINI_SWE_AGENT_VERSION}
READY = ".uni-agent-ready"


class PrepareError(RuntimeError):
    """The environment could not be made; the message says which step failed and its output."""


def harness_cache() -> Path:
    root = cache_dir() / "harness"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root


def default_dir(name: str) -> Path:
    return harness_cache() / f"{name}-{VERSIONS.get(name, 'custom')}"


def prepare(name: str, directory: Path | None = None, python: str = "/usr/bin/python3",
            packages: list[str] | None = None) -> Path:
    """The venv of recipe `name` (or of `packages`), made if it is not there yet; its directory."""
    if packages is None:
        if name not in RECIPES:
            raise PrepareError(f"no recipe named {name!r}; known: {sorted(RECIPES)} (or give the packages)")
        packages = RECIPES[name]
    target = (directory or default_dir(name)).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second prepare waits, then finds it made
        if (target / READY).exists():
            return target
        shutil.rmtree(target, ignore_errors=True)  # an interrupted attempt
        _step([python, "-m", "venv", str(target)], "create the venv")
        _step([str(target / "bin" / "python"), "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
               "-q", *packages], f"install {' '.join(packages)}")
        (target / READY).write_text(" ".join(packages) + "\n")
    return target


def _step(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise PrepareError(f"could not {what} (exit {done.returncode}): {(done.stderr or done.stdout)[-3000:]}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"a recipe ({', '.join(sorted(RECIPES))}) or a name for --packages")
    parser.add_argument("--dir", type=Path, help="where (default: ~/.cache/uni-agent/harness/NAME-VERSION)")
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="the Python the sandboxes run it with (default: /usr/bin/python3)")
    parser.add_argument("--packages", nargs="+", help="pip requirements, instead of the recipe's")


def cmd_prepare(args: argparse.Namespace) -> int:
    """Print the prepared directory (mount it with the agent config's harness.mounts)."""
    try:
        print(prepare(args.name, args.dir, args.python, args.packages))
    except PrepareError as exc:
        print(f"uni-agent harness prepare: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.harness.prepare",
                                     description="make a harness program's environment for mounting into sandboxes")
    add_arguments(parser)
    return cmd_prepare(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
