"""A second user on the node attacks the first one's run through the file system, and fails.

Two real users (useradd): the victim runs the README's path (`parallel_infer.py`: its own LocalCluster with worker
processes, bubblewrap sandboxes, verification, Parquet); the stranger prepares the node before it. The model is a
ScriptedLLM on loopback that applies each task's gold patch (the real llama-server path is tests/test_e2e_llm.py).

Each attack below worked on 04c908e:
- a module planted in Dask's default scratch directory (/tmp/dask-scratch-space, made 0777 by the stranger) was
  imported by the victim's worker processes, as the victim;
- a squatted /tmp/uni-agent-<uid> turned every rollout into an error row, and the rerun then ran nothing;
- the outputs (results, run.json, logs) were readable by everyone.
"""

import json
import os
import stat
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO_ROOT, scripted_run_inputs
from test_run_dask import solver
from unprivileged import ensure_users, run_as, run_python_as, shared_dir
from uni_agent.tasks.swe_form import convert
from uni_agent.testing.scripted_llm import ScriptedLLM

USERS = ("ua-dirs-victim", "ua-dirs-stranger")
SCRIPT = REPO_ROOT / "examples/agent_interaction/parallel_infer.py"
PLANTED = """import os, sys
open(os.environ.get("UA_MARK_DIR", "{marks}") + "/imported-by-uid-%d" % os.getuid(), "w").write(repr(sys.argv))
raise ImportError("planted")
"""


@pytest.fixture(scope="module")
def users():
    return ensure_users(USERS)


@pytest.fixture(scope="module")
def inputs():
    where = shared_dir("uni-agent-stranger-dirs-")
    data, config = scripted_run_inputs(where)
    marks = where / "marks"
    marks.mkdir()
    marks.chmod(0o1777)  # whoever imports a planted module leaves a mark here
    return data, config, marks


def _run(user, data, config, server, out, samples=2):
    return run_as(user, [sys.executable, str(SCRIPT), "--data-path", str(data), "--agent-config-path", str(config),
                         "--max-samples", str(samples), "--n", "1", "--engine", "external", "--base-url",
                         server.base_url, "--model", "scripted", "--local-workers", "2", "--no-progress",
                         "--output-dir", str(out)], timeout=420)


def _plant(stranger, directory: Path, marks: Path) -> None:
    """As the stranger: `directory` made 0777 with modules the run would import (yaml, the first of its workers).
    Made right after removing what is there: another program of root's may have just made Dask's default dir."""
    _remove_as_root(directory)
    code = (f"import os; d = {str(directory)!r}; os.makedirs(d, exist_ok=True); os.chmod(d, 0o777)\n"
            f"for name in ('yaml', 'uni_agent', 'distributed', 'sitecustomize', 'usercustomize'):\n"
            f"    open(os.path.join(d, name + '.py'), 'w').write({PLANTED.format(marks=marks)!r})\n")
    done = run_python_as(stranger, code)
    assert done.returncode == 0, done.stderr


def _remove_as_root(*paths: Path) -> None:
    import shutil

    for path in paths:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)


def _created_outside(user, before: set[str]) -> list[str]:
    """Entries owned by `user` in the node's shared places that were not there before the run."""
    return sorted(p for p in _owned_entries(user) if p not in before)


def _owned_entries(user) -> set[str]:
    found = set()
    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        for entry in Path(top).iterdir():
            try:
                if entry.lstat().st_uid == user.uid:
                    found.add(str(entry))
            except OSError:
                continue
    return found


def test_planted_modules_squatted_scratch_and_loose_outputs_do_not_reach_the_run(users, inputs):
    victim, stranger = users
    data, config, marks = inputs
    tmp = Path("/tmp")
    planted = [tmp / "dask-scratch-space", tmp / f"dask-scratch-space-{victim.uid}", tmp / "dask-worker-space"]
    for directory in planted:
        _plant(stranger, directory, marks)
    before = _owned_entries(victim)
    out = victim.home / f"out-planted-{uuid.uuid4().hex[:8]}"
    try:
        with ScriptedLLM(solver) as server:
            done = _run(victim, data, config, server, out)
    finally:
        _remove_as_root(*planted)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(marks.iterdir()), [p.name for p in marks.iterdir()]  # nothing planted was imported
    results = pd.read_parquet(out / "results")
    assert len(results) == 2 and (results.reward == 1.0).all(), results[["failure_cause"]]

    # Nothing the run made lies outside the victim's private directory and the output dir.
    private = f"/tmp/uni-agent-{victim.uid}"
    assert _created_outside(victim, before) in ([], [private]), _created_outside(victim, before)

    # Private outputs: the output dir and the cache closed to others, every file in them too.
    for top in (out, victim.home / ".cache" / "uni-agent", Path(private)):
        assert stat.S_IMODE(top.stat().st_mode) & 0o077 == 0, (top, oct(top.stat().st_mode))
    loose = [str(p) for p in out.rglob("*") if not p.is_symlink() and p.stat().st_mode & 0o077]
    assert not loose, loose
    read = run_python_as(stranger, f"open({str(out / 'run.json')!r}).read()")
    assert read.returncode != 0 and "PermissionError" in read.stderr, read.stdout


def test_every_directory_on_the_workers_sys_path_is_the_victims_own(users, inputs):
    """Whatever Dask or Python put on a worker's sys.path: a directory the stranger could write (or create) would be
    a way to run code as the victim."""
    victim, stranger = users
    _, _, marks = inputs
    planted = [Path("/tmp/dask-scratch-space"), Path(f"/tmp/dask-scratch-space-{victim.uid}")]
    for directory in planted:
        _plant(stranger, directory, marks)
    code = """
import asyncio, json, sys
from uni_agent.settings import load_settings
from uni_agent.driver.cluster import cluster_client
from uni_agent.private_dirs import private_files

async def main():
    with private_files():
        async with cluster_client(load_settings(local_workers=2, dashboard=False)) as client:
            return await client.run(lambda: sys.path)

print(json.dumps(asyncio.run(main())))
"""
    try:
        done = run_python_as(victim, code, timeout=300)
    finally:
        _remove_as_root(*planted)
    assert done.returncode == 0, done.stderr[-3000:]
    paths = {p for per_worker in json.loads(done.stdout.strip().splitlines()[-1]).values() for p in per_worker}
    assert paths
    writable_by_stranger = []
    for entry in sorted(paths):
        path = Path(entry or victim.home)
        probe = path if path.exists() else path.parent  # a missing entry is as good as its parent is private
        while not probe.exists():
            probe = probe.parent
        info = probe.stat()
        if info.st_uid not in (victim.uid, 0) or (info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX) or \
                (info.st_mode & 0o020 and info.st_gid == stranger.gid):
            writable_by_stranger.append(f"{entry} ({probe}: uid {info.st_uid}, {oct(info.st_mode)})")
        if not path.exists() and probe.stat().st_mode & 0o002:  # sticky /tmp: anyone may create the entry
            writable_by_stranger.append(f"{entry} (missing, creatable in {probe})")
    assert not writable_by_stranger, writable_by_stranger


@pytest.mark.parametrize("squat", ["directory", "symlink"])
def test_a_squatted_private_directory_stops_the_run_before_any_rollout(squat, users, inputs):
    victim, stranger = users
    data, config, _ = inputs
    private = Path(f"/tmp/uni-agent-{victim.uid}")
    _remove_as_root(private)
    elsewhere = Path(f"/tmp/ua-stranger-target-{victim.uid}")
    _remove_as_root(elsewhere)
    make = (f"import os; os.mkdir({str(private)!r}); os.chmod({str(private)!r}, 0o755)" if squat == "directory" else
            f"import os; os.mkdir({str(elsewhere)!r}, 0o777); os.symlink({str(elsewhere)!r}, {str(private)!r})")
    assert run_python_as(stranger, make).returncode == 0
    out = victim.home / f"out-squat-{squat}-{uuid.uuid4().hex[:8]}"
    try:
        with ScriptedLLM(solver) as server:
            refused = _run(victim, data, config, server, out, samples=1)
            errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
            assert refused.returncode == 1, refused.stderr[-3000:]
            assert len(errors) == 1 and str(private) in errors[0], refused.stderr[-3000:]
            assert ("ua-dirs-stranger" if squat == "directory" else "symbolic link") in errors[0], errors
            assert "Traceback" not in refused.stderr, refused.stderr[-3000:]
            assert not (out / "results").exists() or not list((out / "results").glob("*.parquet"))
            assert stat.S_IMODE(private.lstat().st_mode) != 0o700 or private.is_symlink()  # left as it was

            _remove_as_root(private, elsewhere)
            again = _run(victim, data, config, server, out, samples=1)
    finally:  # whatever the stranger left
        if private.is_symlink() or (private.exists() and private.stat().st_uid != victim.uid):
            _remove_as_root(private)
        _remove_as_root(elsewhere)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 already done" in again.stderr, again.stderr[-3000:]
    assert len(pd.read_parquet(out / "results")) == 1


def test_a_worker_whose_private_dir_is_squatted_stops_the_run_before_any_rollout(tmp_path):
    """A dask worker on another node has its own temporary directory and its own squatters: each worker checks its
    private dirs before an engine or sandbox starts there (here, a worker whose TMPDIR holds a loose uni-agent dir)."""
    from distributed import Client, LocalCluster

    from uni_agent import run
    from uni_agent.private_dirs import UnsafeDirectory, dask_dir

    node_tmp = tmp_path / "other-node-tmp"
    loose = node_tmp / f"uni-agent-{os.geteuid()}"
    loose.mkdir(parents=True)
    loose.chmod(0o777)  # as a stranger's squat would be: anyone may put entries in it
    rows = tmp_path / "rows.parquet"
    convert(None, rows)
    with LocalCluster(n_workers=1, processes=True, host="127.0.0.1", dashboard_address=None,
                      local_directory=str(dask_dir()), env={"TMPDIR": str(node_tmp)}) as cluster, \
            Client(cluster) as client, ScriptedLLM(solver) as server:
        with pytest.raises(UnsafeDirectory, match=f"on dask worker tcp://.*: private directory {loose} is writable"):
            run(str(rows), client=client, engine="external", base_url=server.base_url, model_name="scripted",
                output_dir=str(tmp_path / "out"), progress=False, max_samples=1)
    assert not (tmp_path / "out" / "results").exists() or not list((tmp_path / "out" / "results").iterdir())
