"""A wheel built from this tree, installed into a fresh venv outside the repository, runs `uni-agent run` on the
bundled tasks: every default a run needs (the run settings, the agent config, the tasks, the dashboard page) ships
inside the package; nothing is found through a source checkout.

Real parts: setuptools builds the wheel, pip installs it, and the installed `uni-agent` command starts its own
LocalCluster, bubblewrap sandboxes and verification from a directory outside the repository, with its default output
dir. Two stand-ins, said here: the dependencies are not downloaded (a full `pip install` took 3 minutes here), the
fresh venv gets hard links to the files of exactly the distributions uni-agent's metadata requires (and theirs),
taken from the project's .venv, so a dependency the package imports but does not declare fails here as it would for a
user; and the model is a ScriptedLLM that applies the task's gold patch and submits (a real model is
tests/test_e2e_llm.py's)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pandas as pd
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import assistant_turns
from uni_agent.tasks.swe_form import BUNDLED_DIR
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

REPO_ROOT = Path(__file__).resolve().parent.parent  # the tree the wheel is built from
INSTANCES = [json.loads(p.read_text()) for p in sorted(BUNDLED_DIR.glob("*/instance.json"))]
# The bundled tasks' tests run as `python -m pytest` in the sandbox, whose PATH starts with the venv's bin: a venv
# that runs them needs pytest, which is not one of uni-agent's dependencies.
ALSO_INSTALLED = ("pytest",)
KEEP_VARIABLES = ("UNI_AGENT_SANDBOX_ROOT", "UNI_AGENT_CACHE_DIR")  # this test session's own dirs (conftest.py)


def build_wheel(tmp_path: Path) -> Path:
    """The wheel of the working tree, built from a copy (a build dir in the tree could hold stale modules)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    shutil.copytree(REPO_ROOT / "uni_agent", source / "uni_agent",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(dist), str(source)], check=True, capture_output=True, text=True, timeout=300)
    return next(dist.glob("uni_agent-*.whl"))


def requirement_closure(wheel: Path) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions the wheel requires (its METADATA), theirs, and so on; extras left out."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    todo = [Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist:")]
    todo += [Requirement(name) for name in ALSO_INSTALLED]
    found: dict[str, importlib.metadata.Distribution] = {}
    while todo:
        requirement = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name not in found:
            found[name] = importlib.metadata.distribution(requirement.name)
            todo += [Requirement(r) for r in found[name].requires or []]
    return found


def fresh_venv(where: Path, wheel: Path) -> Path:
    """A venv of the system's Python with the wheel installed by pip and its dependencies linked in."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"]).resolve()
    for dist in requirement_closure(wheel).values():
        for file in dist.files or []:
            origin = Path(dist.locate_file(file)).resolve()
            if origin.is_relative_to(ours) and origin.is_file():  # scripts in bin/ are not needed
                target = site / origin.relative_to(ours)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(origin, target)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    return where


def gold_then_submit(body: dict) -> dict:
    """Applies the task's gold patch, then submits."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    instance = next(i for i in INSTANCES if i["problem_statement"].strip() in user)
    if assistant_turns(body) == 0:
        return tool_call_message("execute_bash", {"command": f"git apply <<'EOF'\n{instance['patch']}EOF"})
    return tool_call_message("submit", {})


def test_a_built_wheel_runs_the_bundled_tasks_from_outside_the_repository(tmp_path: Path) -> None:
    started = time.monotonic()
    wheel = build_wheel(tmp_path)
    built = time.monotonic()
    venv = fresh_venv(tmp_path / "venv", wheel)
    installed = time.monotonic()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("UNI_AGENT_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update({k: os.environ[k] for k in KEEP_VARIABLES if k in os.environ})
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import uni_agent; print(uni_agent.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(REPO_ROOT), where

    with ScriptedLLM(gold_then_submit) as server:
        done = subprocess.run([str(venv / "bin" / "uni-agent"), "run", "--engine", "external", "--base-url",
                               server.base_url, "--model", "scripted", "--max-samples", "1", "--no-progress"],
                              cwd=elsewhere, env=env, capture_output=True, text=True, timeout=240)
    ran = time.monotonic()
    assert done.returncode == 0, done.stderr[-3000:]

    output = elsewhere / "outputs" / "run"  # the default output dir, under the working directory
    rows = pd.read_parquet(output / "results")
    assert len(rows) == 1, rows
    row = rows.iloc[0]
    assert row.instance_id == INSTANCES[0]["instance_id"]  # the first bundled task (--max-samples 1)
    assert (row.exit_reason, row.reward) == ("submitted", 1.0), (row.exit_reason, row.error, row.verification)
    assert json.loads(row.verification)["status"] == "resolved"
    settings = json.loads((output / "run.json").read_text())["settings"]
    shipped = Path(where).parent / "defaults" / "agent_config.yaml"
    assert settings["agent_config_path"] == str(shipped) and shipped.is_file()  # the package's own, not the repo's
    print(f"wheel built in {built - started:.1f} s, venv with {len(list(venv.rglob('*.dist-info')))} distributions "
          f"in {installed - built:.1f} s, `uni-agent run` in {ran - installed:.1f} s")
