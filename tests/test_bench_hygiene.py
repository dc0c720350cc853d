"""A bench that cannot mislead (issue 40, goal 5): --out must be new or empty (or cleared, saying so), the CPUs it
reports are the ones the process may use, and lost and duplicated rollouts are counted from the part files as they
are on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from uni_agent.bench.measure import cpus_line, record_counts, usable_cpus
from uni_agent.bench.out_dir import OutDirInUse, prepare_out_dir, refuse_earlier_results

UNI_AGENT = str(Path(sys.executable).parent / "uni-agent")


def _earlier_run(out: Path) -> None:
    """What an earlier `--simulate --out` left: a point's folder with its results."""
    (out / "c8" / "run" / "results").mkdir(parents=True)
    (out / "c8" / "driver.log").write_text("earlier\n")


def test_a_non_empty_out_is_refused_before_anything_starts(tmp_path):
    out = tmp_path / "out"
    _earlier_run(out)
    done = subprocess.run([UNI_AGENT, "bench", "--simulate", "--in-flight", "8", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"--out {out} is not empty (it holds c8/)" in done.stderr and "--clear-out" in done.stderr, done.stderr
    assert "uni-agent bench --simulate:" not in done.stdout  # refused before its header: nothing ran
    assert sorted(os.listdir(out)) == ["c8"] and (out / "c8" / "driver.log").read_text() == "earlier\n"


def test_clear_out_removes_an_earlier_bench_and_says_so(tmp_path):
    out = tmp_path / "out"
    _earlier_run(out)
    (out / "ours-w1-c4").mkdir()
    (out / "bundled.parquet").write_text("x")
    notes = prepare_out_dir(out, clear=True)
    assert os.listdir(out) == []
    assert len(notes) == 1 and str(out) in notes[0] and "bundled.parquet, c8/, ours-w1-c4/" in notes[0]
    assert prepare_out_dir(out, clear=False) == []  # empty: fine
    assert prepare_out_dir(tmp_path / "new", clear=False) == []  # not there yet: fine


def test_clear_out_leaves_a_folder_of_other_files_alone(tmp_path):
    _earlier_run(tmp_path)
    (tmp_path / "thesis.tex").write_text("mine")
    with pytest.raises(OutDirInUse, match=r"also holds thesis\.tex: nothing removed"):
        prepare_out_dir(tmp_path, clear=True)
    assert (tmp_path / "thesis.tex").read_text() == "mine" and (tmp_path / "c8" / "driver.log").exists()


def test_a_point_folder_with_results_is_refused(tmp_path):
    _earlier_run(tmp_path)
    refuse_earlier_results(tmp_path / "c16")  # none there
    with pytest.raises(OutDirInUse, match="already holds a run's results"):
        refuse_earlier_results(tmp_path / "c8" / "run")


def test_usable_cpus_follow_the_affinity():
    if os.cpu_count() < 2:
        pytest.skip("one CPU: nothing to pin to fewer")
    assert usable_cpus() == len(os.sched_getaffinity(0))
    code = "from uni_agent.bench.measure import cpus_line, usable_cpus; print(usable_cpus()); print(cpus_line())"
    pinned = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    assert pinned == ["1", f"1 usable CPUs (of the machine's {os.cpu_count()})"]
    if usable_cpus() == os.cpu_count():
        assert cpus_line() == f"{os.cpu_count()} CPUs"


def test_record_counts_read_the_part_files_as_they_are(tmp_path):
    """A key written twice (a retried rollout whose old row was not superseded) and a rollout never written: the
    run's own reader keeps one row per key; the bench must see both."""
    def part(name: str, keys: list[tuple[str, int]]) -> None:
        pq.write_table(pa.table({"instance_id": [k for k, _ in keys], "rollout": [r for _, r in keys]}),
                       tmp_path / name)

    part("part-0.parquet", [("a", 0), ("a", 1)])
    part("part-1.parquet", [("a", 1), ("b", 0)])
    assert record_counts(tmp_path, rollouts=5) == {"recorded": 4, "duplicates": 1, "lost": 2}
    assert record_counts(tmp_path / "none", rollouts=3) == {"recorded": 0, "duplicates": 0, "lost": 3}


def test_a_simulation_pair_runs_both_trees(tmp_path):
    """`--simulate --baseline DIR`: the earlier tree's simulation, then this tree's, and the line comparing them
    (the pair once failed at once on a renamed helper, and nothing ran it)."""
    from uni_agent.settings import REPO_ROOT

    done = subprocess.run([UNI_AGENT, "bench", "--simulate", "--in-flight", "8", "--workers", "1", "--delay-s", "0.2",
                           "--turns", "1", "--baseline", str(REPO_ROOT), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "-> now, same invocation, same machine" in done.stdout, done.stdout
    assert done.stdout.count("0 lost, 0 duplicate keys") == 2, done.stdout
