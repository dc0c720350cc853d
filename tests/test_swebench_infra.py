"""A broken test environment is an infra failure, never a wrong answer; and every eval log is kept whole.

The log rules (uni_agent/swebench/environment_failures.py) on hand-written logs, then the real path: a repository in
SWE-bench form for `pallets/flask` 2.3 whose test module imports a package that is not installed (the environment
is broken on purpose, as a missing `_pytest._version` broke pytest-dev/pytest's), graded in a real bubblewrap
sandbox with its gold patch: status `error` with the reason, failure_kind `infra`, and the whole log written beside
the results. The same repository with the package present resolves.
"""

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from uni_agent.episode.failures import classify
from uni_agent.episode.rollout import RolloutResult
from uni_agent.verification import Verification
from uni_agent.swebench.environment_failures import environment_failure
from uni_agent.swebench.grading import SweGrade

PATCH = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,3 @@\n+import json\n"
         " def add(a, b):\n-    return a - b\n+    return a + b\n")


def _grade(**statuses) -> SweGrade:
    f2p = {"tests/test_calc.py::test_add": statuses.get("f2p", "MISSING")}
    p2p = {"tests/test_calc.py::test_zero": statuses.get("p2p", "MISSING")}
    return SweGrade("x__y-1", True, {}, f2p, p2p)


def test_a_missing_package_the_answer_does_not_import_is_the_environment():
    log = "ImportError while importing test module\nE   ModuleNotFoundError: No module named '_pytest._version'\n"
    reason = environment_failure(log, _grade(), PATCH, None)
    assert reason and "_pytest._version" in reason and "2 of 2" in reason


def test_a_missing_module_the_answer_imports_is_the_answer():
    patch = PATCH.replace("+import json", "+import yaml_helpers.loader")
    log = "  File \"/testbed/calc.py\", line 1\nModuleNotFoundError: No module named 'yaml_helpers'\n"
    assert environment_failure(log, _grade(), patch, None) is None


def test_an_answer_that_breaks_collection_stays_a_wrong_answer():
    log = "ERROR collecting tests/test_calc.py\n  File \"/testbed/calc.py\", line 3\nSyntaxError: invalid syntax\n"
    assert environment_failure(log, _grade(), PATCH, None) is None
    assert "no FAIL_TO_PASS/PASS_TO_PASS test ran (the answer is empty)" == environment_failure(log, _grade(), "", None)


def test_a_failed_install_step_is_the_environment_and_a_missing_runner_too():
    install = "python -m pip install -e ."
    log = (f"+ {install}\nLooking in indexes: https://pypi.org/simple\nERROR: Could not find a version that "
           f"satisfies the requirement setuptools>=40.8.0\n+ git checkout abc tests/test_calc.py\n")
    assert "the install step (python -m pip install -e .) failed: ERROR: Could not find" in \
        environment_failure(log, _grade(f2p="FAILED", p2p="PASSED"), PATCH, install)
    runner = "/tmp/eval.sh: line 14: pytest: command not found\n"
    assert "pytest: command not found" in environment_failure(runner, _grade(), PATCH, None)
    assert environment_failure(runner, _grade(f2p="FAILED", p2p="PASSED"), PATCH, None) is None  # tests ran


def test_the_row_says_infra_with_the_reason():
    verification = Verification(status="error", error="broken test environment: no FAIL_TO_PASS test ran")
    row = RolloutResult(run_id="r", instance_id="t", rollout=0, data_source="d", agent_name="a",
                        exit_reason="submitted")
    row.record(verification)
    classify(row)
    assert row.failure_kind == "infra" and "broken test environment" in row.failure_cause


def test_keep_log_writes_the_whole_log_and_the_row_only_its_path(tmp_path):
    verification = Verification(status="unresolved", log="x" * 20_000 + "END", log_tail="END")
    verification.keep_log(tmp_path, "astropy__astropy-1-r0")
    assert (tmp_path / "eval_logs" / "astropy__astropy-1-r0.log").read_text().endswith("x" * 100 + "END")
    stored = json.loads(verification.to_json())
    assert stored["log_file"] == "eval_logs/astropy__astropy-1-r0.log" and "log" not in stored


# ------------------------------------------------------------------------------- the real path, in a sandbox

TEST_CODE = ("import {module}\nfrom calc import add\n\n\ndef test_zero():\n    print('noise ' * 2000)\n"
             "    assert add(0, 0) == 0\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def _task(root: Path, module: str) -> dict:
    """pallets/flask 2.3 form; the tests import `module` (json: present; another name: a broken environment)."""
    repo = root / f"pallets__flask-9{len(module)}"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests" / "test_calc.py").write_text("from calc import add\n")
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    (repo / "tests" / "test_calc.py").write_text(TEST_CODE.format(module=module))
    test_patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    metadata = {"instance_id": repo.name, "repo": "pallets/flask", "version": "2.3",
                "base_commit": _git(repo, "rev-parse", "HEAD").strip(), "patch": PATCH.replace("+import json\n", "")
                .replace("@@ -1,2 +1,3 @@", "@@ -1,2 +1,2 @@"), "test_patch": test_patch, "env_prebuilt": "1",
                "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
                "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_zero"])}
    return {"repo": repo, "metadata": metadata}


def _agent(task):
    from conftest import AGENT_CONFIG
    from uni_agent import AgentConfigs

    kwargs = {"env": {"deployment": {"type": "local", "repo": str(task["repo"])}},
              "reward": {"name": "swe_bench", "metadata": task["metadata"], "eval_timeout": 120}}
    return AgentConfigs.load(AGENT_CONFIG).for_row("swe_agent", kwargs, "test")


@pytest.mark.parametrize("module, status", [("json", "resolved"), ("uni_agent_absent_dependency", "error")])
def test_a_deliberately_broken_environment_is_infra(tmp_path, module, status):
    from uni_agent.grading import verify_reference

    task = _task(tmp_path, module)
    outcome = asyncio.run(verify_reference(_agent(task), "gold", "broken-env"))
    assert outcome.status == status, (outcome.error, outcome.log_tail[-2000:])
    row = RolloutResult(run_id="r", instance_id=task["metadata"]["instance_id"], rollout=0, data_source="d",
                        agent_name="a", exit_reason="submitted")
    row.record(outcome)
    classify(row)
    if status == "error":
        assert "No module named 'uni_agent_absent_dependency'" in outcome.error and outcome.reward == 0.0
        assert row.failure_kind == "infra" and "broken test environment" in row.failure_cause
    else:
        assert row.failure_kind == "none" and outcome.reward == 1.0
        assert len(outcome.log) > 8000 > len(outcome.log_tail) - 1  # the noisy test: only the tail is in the row
    outcome.keep_log(tmp_path / "out", f"{task['metadata']['instance_id']}-gold")
    kept = (tmp_path / "out" / outcome.log_file).read_text()
    assert kept == outcome.log and ">>>>> Start Test Output" in kept
