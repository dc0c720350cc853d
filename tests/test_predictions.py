"""`uni-agent export-preds`: a run's results → preds.jsonl and the official harness's report shape.

The report is compared with what swebench 4.1.0's own `make_run_report` writes for the same predictions, given a
report.json per instance that the harness would have completed."""

import json
from pathlib import Path

import pytest

from uni_agent.cli import main
from uni_agent.driver.results import ResultStore
from uni_agent.episode.rollout import RolloutResult
from uni_agent.grading import Verification

RUN_ID = "20260101-000000-abc123"
MODEL = "org/model-x"
PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"

# instance → (rollout 0's patch, its verification status, resolved); None: no rollout 0
CASES = {
    "astropy__astropy-1": (PATCH, "resolved", True),
    "django__django-2": (PATCH, "unresolved", False),
    "flask__flask-3": (PATCH, "patch_failed", False),
    "requests__requests-4": ("", "unresolved", False),  # empty patch (verified as "no change")
    "sympy__sympy-5": (PATCH, "timeout", False),
    "xarray__xarray-6": (PATCH, None, False),  # not verified (--no-verify)
    "pylint__pylint-7": None,
}


def _result(instance_id, rollout, patch, status, resolved):
    verification = None if status is None else Verification(status=status, resolved=resolved)
    return RolloutResult(run_id=RUN_ID, instance_id=instance_id, rollout=rollout, data_source="swe_bench_verified",
                         agent_name="swe_agent", exit_reason="submitted", patch=patch, reward=float(resolved),
                         resolved=resolved, verification=verification)


@pytest.fixture
def run_dir(tmp_path):
    out = tmp_path / "run"
    store = ResultStore(out, flush_every=3)
    for instance_id, case in CASES.items():
        if case is not None:
            store.add(_result(instance_id, 0, *case))
        store.add(_result(instance_id, 1, PATCH + "# rollout 1\n", "unresolved", False))
    store.flush()
    (out / "run.json").write_text(json.dumps({"run_id": RUN_ID}))
    (out / "summary.json").write_text(json.dumps({"run_id": RUN_ID, "avg_at_n": 0.1}))
    return out


def test_export_writes_predictions_and_the_report(run_dir, capsys):
    assert main(["export-preds", str(run_dir), "--model-name", MODEL]) == 0
    preds = [json.loads(line) for line in (run_dir / "preds.jsonl").read_text().splitlines()]
    expected_ids = sorted(i for i, c in CASES.items() if c is not None)
    assert [p["instance_id"] for p in preds] == expected_ids
    assert all(set(p) == {"instance_id", "model_name_or_path", "model_patch"} for p in preds)
    assert all(p["model_name_or_path"] == MODEL for p in preds)
    by_id = {p["instance_id"]: p for p in preds}
    assert by_id["astropy__astropy-1"]["model_patch"] == PATCH  # rollout 0's patch, not rollout 1's
    assert by_id["requests__requests-4"]["model_patch"] == ""
    report = json.loads((run_dir / f"org__model-x.{RUN_ID}.json").read_text())
    assert report["resolved_ids"] == ["astropy__astropy-1"]
    assert report["unresolved_ids"] == ["django__django-2"]
    assert report["completed_ids"] == ["astropy__astropy-1", "django__django-2"]
    assert report["error_ids"] == ["flask__flask-3", "sympy__sympy-5", "xarray__xarray-6"]
    assert report["empty_patch_ids"] == ["requests__requests-4"]
    assert report["incomplete_ids"] == ["pylint__pylint-7"]
    assert report["total_instances"] == 7 and report["submitted_instances"] == 6
    assert report["schema_version"] == 2
    out = capsys.readouterr().out
    assert "wrote 6 predictions" in out and "1 resolved" in out


def test_report_equals_the_official_make_run_report(run_dir, tmp_path, monkeypatch):
    from swebench.harness.reporting import make_run_report

    main(["export-preds", str(run_dir), "--model-name", MODEL])
    ours = json.loads((run_dir / f"org__model-x.{RUN_ID}.json").read_text())
    # What the harness leaves after evaluating the same predictions: a report.json for each instance it completed.
    harness = tmp_path / "harness"
    monkeypatch.chdir(harness.mkdir() or harness)
    lines = (run_dir / "preds.jsonl").read_text().splitlines()
    predictions = {json.loads(line)["instance_id"]: json.loads(line) for line in lines}
    for instance_id, case in CASES.items():
        if case is not None and case[0] and case[1] in ("resolved", "unresolved"):
            log_dir = Path("logs/run_evaluation") / RUN_ID / MODEL.replace("/", "__") / instance_id
            log_dir.mkdir(parents=True)
            (log_dir / "report.json").write_text(json.dumps({instance_id: {"resolved": case[2]}}))
    official_path = make_run_report(predictions, [{"instance_id": i} for i in CASES], RUN_ID, client=None)
    official = json.loads(Path(official_path).read_text())
    assert Path(official_path).name == f"org__model-x.{RUN_ID}.json"
    assert ours == official


def test_another_rollout_and_defaults(run_dir):
    assert main(["export-preds", str(run_dir), "--rollout", "1"]) == 0
    preds = [json.loads(line) for line in (run_dir / "preds.jsonl").read_text().splitlines()]
    assert len(preds) == len(CASES) and all(p["model_patch"].endswith("# rollout 1\n") for p in preds)
    assert all(p["model_name_or_path"] == "uni-agent" for p in preds)  # no model name recorded
    report = json.loads((run_dir / f"uni-agent.{RUN_ID}.json").read_text())
    assert report["unresolved_instances"] == len(CASES) and report["incomplete_ids"] == []


def test_errors_name_the_problem(tmp_path, run_dir, capsys):
    assert main(["export-preds", str(tmp_path / "nothing")]) == 2
    assert "no results" in capsys.readouterr().err
    assert main(["export-preds", str(run_dir), "--rollout", "5"]) == 2
    assert "no results for rollout 5 (rollouts present: [0, 1])" in capsys.readouterr().err
