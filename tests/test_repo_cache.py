"""The repository cache: HEAD is the task's own commit, snapshots share their git objects, `cache prune` and
`cache size`; and `convert-tasks` keeps an instance's test_cmd.

Real git repositories in a temporary cache (UNI_AGENT_CACHE_DIR), a real bubblewrap sandbox over a snapshot."""

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from uni_agent.cache_maintenance import cache_size, prune_repos
from uni_agent.sandbox.repo import LAST_USED, OBJECT_STORE, prepare_base_repo


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("UNI_AGENT_CACHE_DIR", str(root))
    return root


@pytest.fixture
def history(tmp_path):
    """An upstream repository with two commits, and two checkouts of it (as two SWE-bench instances of one repo
    at two base commits), each a clone with its own object store."""
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    _git(upstream, "init", "-q", "-b", "main")
    for i in range(2):
        (upstream / "lib.py").write_text(f"VALUE = {i}\n# {os.urandom(100_000).hex()}\n")  # incompressible
        _git(upstream, "add", "-A")
        _git(upstream, "commit", "-q", "-m", f"commit {i}")
    _git(upstream, "gc", "-q")  # one pack, as a fetched repository has
    commits = _git(upstream, "rev-list", "--reverse", "HEAD").split()
    checkouts = []
    for i, commit in enumerate(commits):
        checkout = tmp_path / f"org__repo-{i}"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(upstream), str(checkout)], check=True)
        _git(checkout, "checkout", "-q", commit)
        checkouts.append(checkout)
    return commits, checkouts


def test_a_clean_checkout_keeps_its_head_and_a_dirty_tree_gets_one_snapshot_commit(cache, history):
    commits, checkouts = history
    snapshot = prepare_base_repo(checkouts[0])
    assert _git(snapshot, "rev-parse", "HEAD") == commits[0]
    assert _git(snapshot, "status", "--porcelain") == ""  # the last-used stamp is not a file of the tree
    (checkouts[1] / "scratch.txt").write_text("left by hand\n")
    dirty = prepare_base_repo(checkouts[1])
    assert _git(dirty, "log", "-1", "--format=%s") == "uni-agent base snapshot"
    assert _git(dirty, "rev-parse", "HEAD~1") == commits[1]


def test_snapshots_of_one_history_share_their_objects(cache, history):
    _, checkouts = history
    first, second = (prepare_base_repo(c) for c in checkouts)
    packs = [sorted((s / ".git" / "objects" / "pack").glob("*.pack")) for s in (first, second)]
    assert packs[0] and [p.name for p in packs[0]] == [p.name for p in packs[1]]
    assert os.stat(packs[0][0]).st_ino == os.stat(packs[1][0]).st_ino  # one file on disk, linked twice
    assert os.stat(packs[0][0]).st_nlink == 3  # the store's entry and the two snapshots'
    assert _git(second, "log", "--oneline").count("\n") == 1  # a complete repository on its own
    parts = {p.name: p for p in cache_size(cache)}
    shared = parts[f"repos/{OBJECT_STORE} (shared git objects)"].bytes
    naive = sum(f.stat().st_blocks * 512 for s in (first, second) for f in s.rglob("*") if f.is_file())
    assert shared >= packs[0][0].stat().st_size > 100_000  # the pack is counted under the store, once
    assert shared + parts["repos (snapshots)"].bytes <= naive - packs[0][0].stat().st_size


def test_prune_removes_unused_snapshots_and_objects_only_they_held(cache, history):
    _, checkouts = history
    old, kept = (prepare_base_repo(c) for c in checkouts)
    (kept / "extra").mkdir()  # not a part of `old`'s objects: kept's own file must survive
    stale = time.time() - 30 * 86400
    os.utime(old / LAST_USED, (stale, stale))
    removed, freed = prune_repos(older_than_days=7)
    assert removed == 1 and not old.exists() and kept.exists() and freed > 0
    assert _git(kept, "log", "--oneline").count("\n") == 1  # its objects are still there
    removed, freed = prune_repos(older_than_days=0)
    assert removed == 1 and not kept.exists()
    assert not [f for f in (cache / "repos" / OBJECT_STORE).rglob("*") if f.is_file()]  # nothing links them


def test_head_inside_the_sandbox_is_the_base_commit(cache, history):
    from conftest import AGENT_CONFIG
    from uni_agent import AgentConfigs
    from uni_agent.sandbox.start import start_sandbox

    commits, checkouts = history
    agent = AgentConfigs.load(AGENT_CONFIG).for_row(
        "swe_agent", {"env": {"deployment": {"type": "local", "repo": str(checkouts[0])}}}, "test")

    async def head() -> str:
        sandbox = await start_sandbox(agent, name="head")
        try:
            return (await sandbox.exec("git rev-parse HEAD && git status --porcelain | wc -l", 30)).output
        finally:
            await sandbox.close()

    assert asyncio.run(head()).split() == [commits[0], "0"]


def test_convert_tasks_keeps_test_cmd(tmp_path):
    from uni_agent.tasks.swe_form import BUNDLED_DIR, convert

    source = next(p for p in sorted(BUNDLED_DIR.iterdir()) if (p / "instance.json").exists())
    task = tmp_path / "tasks" / source.name
    task.mkdir(parents=True)
    instance = json.loads((source / "instance.json").read_text())
    instance["test_cmd"] = "python -m pytest -rA -x"
    (task / "instance.json").write_text(json.dumps(instance))
    (task / "repo").mkdir()
    convert(tmp_path / "tasks", tmp_path / "rows.parquet")
    row = pq.read_table(tmp_path / "rows.parquet").to_pylist()[0]
    assert row["extra_info"]["tools_kwargs"]["reward"]["metadata"]["test_cmd"] == "python -m pytest -rA -x"


def test_a_wave_of_starts_shares_tree_walks_and_none_misses_an_earlier_edit(tmp_path, monkeypatch):
    """The snapshot's fingerprint walks the source tree at every start: 24 starts at once share a few walks (each
    waits for one that began after it asked), and a start after an edit sees the edit."""
    import threading

    from uni_agent.sandbox import repo as repo_module

    source = tmp_path / "src"
    (source / ".git" / "objects").mkdir(parents=True)
    (source / ".git" / "objects" / "ab").write_text("an object: never walked\n")
    (source / "a.py").write_text("A = 1\n")
    walked = []
    real_walk = repo_module._tree_fingerprint

    def slow_walk(path):
        walked.append(path)
        time.sleep(0.2)
        return real_walk(path)

    monkeypatch.setattr(repo_module, "_tree_fingerprint", slow_walk)
    results, gate = [], threading.Barrier(24)

    def start():
        gate.wait()
        results.append(repo_module._fresh_fingerprint(source))

    threads = [threading.Thread(target=start) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 24 and len(set(results)) == 1
    assert len(walked) <= 3  # one that may have begun before some asked, one after; not 24
    (source / "a.py").write_text("A = 2  # edited\n")
    assert repo_module._fresh_fingerprint(source) != results[0]
    (source / ".git" / "objects" / "cd").write_text("git's own files do not count\n")
    edited = repo_module._fresh_fingerprint(source)
    assert repo_module._fresh_fingerprint(source) == edited
