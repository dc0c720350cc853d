"""Our SWE-bench eval script and grade against what the official `swebench` package (4.1.0) produces itself.

Fixtures (tests/fixtures/swebench/, made by make_fixtures.py): 13 SWE-bench Verified-style rows over all 12 Verified
repositories, each with eval logs in its own runner's format (pytest -rA in several flavours, django's runtests,
sympy's bin/test, pytest under tox) where the tests pass, fail, error and are missing, plus logs whose results lie
outside the markers, that lack the end marker, and that carry the harness's patch-failure marker.

- eval script: ours must equal `make_test_spec(row).eval_script`, except for the documented reset lines when the
  test patch adds files (then the expected difference is computed here from the diff text, independently).
- grade: our report must equal `get_eval_report(make_test_spec(row), prediction, log_file, True)` key for key.
- the flow in a real sandbox: a small repository graded in a bubblewrap sandbox (gold, empty, a tampering patch, a
  patch that does not apply, an add-only test patch, a timeout) and in a podman container, and the gold/empty check
  on Dask with resume.

Real SWE-bench images cannot run here (no Docker Hub, no registry access): a user with access checks the same flow
with examples/agent_interaction/parallel_verify_swe.py on podman/docker/Modal (see docs/datasets.md).
"""

import asyncio
import json
import re
import subprocess
from pathlib import Path

import pytest

import swebench.harness.test_spec.python as official_python
from swebench.harness.grading import get_eval_report
from swebench.harness.run_evaluation import GIT_APPLY_CMDS as OFFICIAL_GIT_APPLY_CMDS
from swebench.harness.test_spec.test_spec import make_test_spec
from uni_agent.config import ConfigError
from uni_agent.swebench import spec as our_spec
from uni_agent.swebench.grading import MISSING, grade_log

FIXTURES = Path(__file__).parent / "fixtures" / "swebench"
ROWS = [json.loads(line) for line in (FIXTURES / "instances.jsonl").read_text().splitlines()]
BY_ID = {row["instance_id"]: row for row in ROWS}
LOGS = sorted((FIXTURES / "logs").glob("*.log"))
VERIFIED_REPOS = {"astropy/astropy", "django/django", "matplotlib/matplotlib", "mwaskom/seaborn", "pallets/flask",
                  "psf/requests", "pydata/xarray", "pylint-dev/pylint", "pytest-dev/pytest",
                  "scikit-learn/scikit-learn", "sphinx-doc/sphinx", "sympy/sympy"}
RESOLVING_SCENARIOS = {"pass", "outside_markers"}


@pytest.fixture(autouse=True)
def offline_specs(monkeypatch):
    """make_test_spec also builds the image's environment script, which downloads requirements.txt or
    environment.yml from GitHub for many repos. Grading and the eval script do not use it: stub the downloads, and
    make any other network access fail loudly instead of hanging."""
    monkeypatch.setattr(official_python, "get_requirements_by_commit", lambda repo, commit: "pytest\n")
    monkeypatch.setattr(official_python, "get_environment_yml_by_commit",
                        lambda repo, commit, env_name: f"name: {env_name}\ndependencies:\n  - python=3.9\n")

    def no_network(*args, **kwargs):
        raise AssertionError(f"unexpected network access: {args}")

    monkeypatch.setattr(official_python.requests, "get", no_network)


def _official_spec(row):
    return make_test_spec(row)


def _added_files(test_patch: str) -> list[str]:
    """Files a diff creates, read from the diff text itself (independent of unidiff)."""
    added, current = [], None
    for line in test_patch.splitlines():
        if line.startswith("diff --git "):
            current = line.split(" b/", 1)[1]
        elif line.startswith("--- /dev/null") and current:
            added.append(current)
    return added


def _scenario(log: Path) -> tuple[str, str]:
    instance_id, scenario, _ = log.name.rsplit(".", 2)
    return instance_id, scenario


# ------------------------------------------------------------------------------------------------ the fixtures

def test_fixtures_span_the_verified_repositories():
    repos = {row["repo"] for row in ROWS}
    assert repos <= VERIFIED_REPOS and len(repos) >= 10, repos
    assert len(repos) == 12
    for row in ROWS:  # every row has the four basic scenarios
        scenarios = {_scenario(log)[1] for log in LOGS if _scenario(log)[0] == row["instance_id"]}
        assert {"pass", "fail", "error", "missing"} <= scenarios, row["instance_id"]
    # both encodings of the test lists, and test patches that add files (one only adds)
    assert {type(row["FAIL_TO_PASS"]) for row in ROWS} == {str, list}
    assert any(_added_files(row["test_patch"]) for row in ROWS)
    assert any(not re.search(r"^--- a/", row["test_patch"], re.M) for row in ROWS)
    assert len(LOGS) >= 50


# ----------------------------------------------------------------------------------------------- eval scripts

@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["instance_id"])
def test_eval_script_equals_the_official_one(row):
    official = _official_spec(row).eval_script
    ours = our_spec.eval_script(row)
    added = _added_files(row["test_patch"])
    if not added:
        assert ours == official
        return
    # With added files, only the two reset lines differ: the official `git checkout <base> <modified>` stays when
    # there are modified files (and goes when there are none: a bare checkout), and `rm -rf -- <added>` follows.
    official_lines = official.splitlines()
    resets = [i for i, line in enumerate(official_lines) if line.startswith(f"git checkout {row['base_commit']}")]
    assert len(resets) == 2
    expected: list[str] = []
    for i, line in enumerate(official_lines):
        if i in resets:
            if line.strip() != f"git checkout {row['base_commit']}":
                expected.append(line)
            expected.append("rm -rf -- " + " ".join(added))
        else:
            expected.append(line)
    assert ours.splitlines() == expected
    assert ours.endswith("\n")


def test_add_only_test_patch_never_checks_out_the_bare_commit():
    row = BY_ID["sphinx-doc__sphinx-8595"]
    official = _official_spec(row).eval_script
    assert f"git checkout {row['base_commit']} \n" in official  # 4.1.0's bare checkout (SWE-bench#518)
    ours = our_spec.eval_script(row)
    assert "git checkout" not in ours
    assert ours.count("rm -rf -- tests/roots/test-ext-autodoc/target/empty_all.py "
                      "tests/test_ext_autodoc_automodule.py") == 2


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["instance_id"])
def test_eval_script_runs_the_spec_test_command_on_the_directives(row):
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.python import get_test_directives

    command = " ".join([MAP_REPO_VERSION_TO_SPECS[row["repo"]][row["version"]]["test_cmd"],
                        *get_test_directives(row)])
    lines = our_spec.eval_script(row).splitlines()
    start = lines.index(": '>>>>> Start Test Output'")
    assert lines[start + 1] == command and lines[start + 2] == ": '>>>>> End Test Output'"
    assert row["test_patch"] in our_spec.eval_script(row)  # applied through the heredoc, verbatim


def test_patch_commands_and_image_names_are_the_official_ones():
    assert our_spec.GIT_APPLY_CMDS == tuple(OFFICIAL_GIT_APPLY_CMDS)
    for row in ROWS:
        key = make_test_spec(row, namespace="swebench").instance_image_key  # "<ns>/sweb.eval.x86_64.<id>:latest"
        assert key.endswith(":latest")
        for deployment in ("modal", "docker", "podman"):
            assert our_spec.image_name(row["instance_id"], deployment) == key.removesuffix(":latest")
        assert our_spec.image_name(row["instance_id"], "vefaas") == (
            "enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified/" +
            key.removeprefix("swebench/").replace(":latest", ":v2"))
        assert our_spec.image_name(row["instance_id"], "local") is None
    assert our_spec.image_name("astropy__astropy-12907", "modal") == \
        "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907"
    assert our_spec.image_name("Django__Django-11099", "docker") == "swebench/sweb.eval.x86_64.django_1776_django-11099"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["instance_id"])
def test_our_offline_test_spec_matches_make_test_spec(row):
    ours, official = our_spec.official_test_spec(row), make_test_spec(row, namespace="swebench")
    for field in ("instance_id", "repo", "version", "FAIL_TO_PASS", "PASS_TO_PASS", "language", "docker_specs",
                  "instance_image_key"):
        assert getattr(ours, field) == getattr(official, field), field
    assert ours.eval_script == our_spec.eval_script(row)


def test_an_unknown_version_is_an_error_not_a_guess():
    row = dict(BY_ID["scikit-learn__scikit-learn-13142"], version="0.2")  # "0.20" read as a number
    with pytest.raises(ConfigError, match="not a known version of scikit-learn/scikit-learn"):
        our_spec.eval_script(row)


# --------------------------------------------------------------------------------------------------- grading

@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name.removesuffix(".log"))
def test_grade_equals_the_official_report(log):
    instance_id, scenario = _scenario(log)
    row = BY_ID[instance_id]
    prediction = {"instance_id": instance_id, "model_name_or_path": "test", "model_patch": row["patch"]}
    official = get_eval_report(_official_spec(row), prediction, str(log), include_tests_status=True)
    grade = grade_log(row, log.read_text())
    assert grade.report(row["patch"]) == official
    # the fixtures mean what their names say, for the official harness too
    assert official[instance_id]["resolved"] is (scenario in RESOLVING_SCENARIOS)
    assert grade.resolved is (scenario in RESOLVING_SCENARIOS)
    assert grade.tests_found is (scenario not in ("no_end_marker", "apply_failed_marker"))


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["instance_id"])
def test_per_test_status_says_which_test_failed(row):
    f2p = row["FAIL_TO_PASS"] if isinstance(row["FAIL_TO_PASS"], list) else json.loads(row["FAIL_TO_PASS"])
    p2p = row["PASS_TO_PASS"] if isinstance(row["PASS_TO_PASS"], list) else json.loads(row["PASS_TO_PASS"])
    logs = {s: (FIXTURES / "logs" / f"{row['instance_id']}.{s}.log").read_text()
            for s in ("pass", "fail", "error", "missing")}
    passed = grade_log(row, logs["pass"])
    assert set(passed.fail_to_pass.values()) == {"PASSED"} and set(passed.pass_to_pass.values()) <= {"PASSED"}
    assert passed.resolution == "RESOLVED_FULL"
    failed = grade_log(row, logs["fail"])
    assert failed.fail_to_pass[f2p[-1]] == "FAILED"
    assert failed.resolution == ("RESOLVED_PARTIAL" if len(f2p) > 1 else "RESOLVED_NO")
    errored = grade_log(row, logs["error"])
    broken = (p2p or f2p)[0]
    # seaborn's official parser does not read ERROR lines: the test is then missing, which fails it all the same
    expected = MISSING if row["repo"] == "mwaskom/seaborn" else "ERROR"
    assert {**errored.fail_to_pass, **errored.pass_to_pass}[broken] == expected
    missing = grade_log(row, logs["missing"])
    assert missing.fail_to_pass[f2p[0]] == MISSING and not missing.resolved


def test_a_missing_prediction_is_graded_like_the_harness(tmp_path):
    row = BY_ID["pallets__flask-5014"]
    log = FIXTURES / "logs" / "pallets__flask-5014.pass.log"
    prediction = {"instance_id": row["instance_id"], "model_name_or_path": "m", "model_patch": None}
    official = get_eval_report(_official_spec(row), prediction, str(log), include_tests_status=True)
    assert grade_log(row, log.read_text()).report(None) == official


def test_the_old_pytest_parser_would_disagree():
    """The check above is discriminating: our generic pytest parser (bundled tasks) gets django and sympy wrong."""
    from uni_agent.grading.pytest_log import grade as generic_grade, parse_pytest_log

    for instance_id in ("django__django-11099", "sympy__sympy-20590"):
        row = BY_ID[instance_id]
        f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
        text = (FIXTURES / "logs" / f"{instance_id}.pass.log").read_text()
        assert not generic_grade(f2p, p2p, parse_pytest_log(text)).resolved
        assert grade_log(row, text).resolved


# ------------------------------------------------------------------------- the flow in a real (local) sandbox

BASE_CODE = "def add(a, b):\n    return a - b\n"
TEST_CODE = "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def _diff(repo: Path, edit) -> str:
    """The git diff of an edit made in a scratch clone."""
    edit(repo)
    _git(repo, "add", "-A")
    out = _git(repo, "diff", "--cached", "HEAD")
    _git(repo, "reset", "-q", "--hard", "HEAD")
    _git(repo, "clean", "-qfd")
    return out


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):
    """A repository in SWE-bench form for `pallets/flask` 2.3 (test_cmd `pytest -rA`, the pytest parser)."""
    root = tmp_path_factory.mktemp("swe")
    repo = root / "pallets__flask-90001"
    repo.mkdir()
    (repo / "calc.py").write_text(BASE_CODE)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_calc.py").write_text(TEST_CODE)
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base_commit = _git(repo, "rev-parse", "HEAD").strip()
    gold = _diff(repo, lambda r: (r / "calc.py").write_text("def add(a, b):\n    return a + b\n"))
    test_patch = _diff(repo, lambda r: (
        (r / "tests" / "test_calc.py").write_text(TEST_CODE + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"),
        (r / "tests" / "test_new.py").write_text(
            "from calc import add\n\n\ndef test_new():\n    assert add(1, 1) == 2\n"),
    ))
    # An agent that "fixes" the issue by rewriting the tests, and creates the hidden test file itself.
    tamper = _diff(repo, lambda r: (
        (r / "tests" / "test_calc.py").write_text("def test_zero():\n    pass\n\n\ndef test_add():\n    pass\n"),
        (r / "tests" / "test_new.py").write_text("def test_new():\n    pass\n"),
    ))
    metadata = {
        "instance_id": repo.name, "repo": "pallets/flask", "version": "2.3", "base_commit": base_commit,
        "patch": gold, "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add", "tests/test_new.py::test_new"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_zero"]),
    }
    return {"repo": repo, "metadata": metadata, "gold": gold, "tamper": tamper}


def _agent(task, **reward):
    from conftest import AGENT_CONFIG
    from uni_agent import AgentConfigs

    # env_prebuilt: the host's environment stands in for a built one, so the eval script skips the spec's
    # `pip install -e .` (which would fail here: a failed install step is a broken environment, graded as infra).
    kwargs = {"env": {"deployment": {"type": "local", "repo": str(task["repo"])},
                      "env_variables": {"PIP_NO_INDEX": "1"}},
              "reward": {"name": "swe_bench", "metadata": {**task["metadata"], "env_prebuilt": "1"},
                         "eval_timeout": 120, **reward}}
    return AgentConfigs.load(AGENT_CONFIG).for_row("swe_agent", kwargs, "test")


@pytest.mark.parametrize("patch_kind, status, patch_applied", [
    ("gold", "resolved", True),
    ("empty", "unresolved", True),
    ("tamper", "unresolved", True),
    ("garbage", "patch_failed", False),
])
def test_swe_bench_grader_in_a_bubblewrap_sandbox(tiny_task, patch_kind, status, patch_applied):
    from uni_agent.grading import verify_patch

    patch = {"gold": tiny_task["gold"], "empty": "", "tamper": tiny_task["tamper"],
             "garbage": "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n",
             }[patch_kind]
    outcome = asyncio.run(verify_patch(_agent(tiny_task), patch, f"swe-{patch_kind}"))
    assert outcome.status == status, (outcome.error, outcome.log_tail[-3000:])
    assert outcome.patch_applied is patch_applied
    if status == "patch_failed":
        assert outcome.report is None and outcome.reward == 0.0  # the harness writes no report: an error
        assert "patch --batch --fuzz=5 -p1 -i" in outcome.log_tail  # all three official commands were tried
        return
    assert ">>>>> Start Test Output" in outcome.log_tail
    instance_id = tiny_task["metadata"]["instance_id"]
    assert outcome.report[instance_id]["patch_successfully_applied"] is True
    assert outcome.report[instance_id]["resolved"] is (status == "resolved")
    assert outcome.reward == (1.0 if status == "resolved" else 0.0)
    if patch_kind == "gold":
        assert set(outcome.fail_to_pass.values()) == {"PASSED"} and outcome.pass_to_pass == {
            "tests/test_calc.py::test_zero": "PASSED"}
    if patch_kind == "tamper":  # the hidden tests ran, not the agent's: test_add fails against the unfixed code
        assert outcome.fail_to_pass["tests/test_calc.py::test_add"] == "FAILED"
        assert outcome.fail_to_pass["tests/test_new.py::test_new"] == "FAILED"


def test_swe_bench_grader_with_an_add_only_test_patch(tiny_task):
    """The test patch only adds a file, and the agent created that file first: it is replaced, HEAD stays put."""
    from uni_agent.grading import verify_patch

    new_only = "".join(tiny_task["metadata"]["test_patch"].partition("diff --git a/tests/test_new.py")[1:])
    assert new_only.startswith("diff --git a/tests/test_new.py") and "--- /dev/null" in new_only
    task = dict(tiny_task, metadata=dict(tiny_task["metadata"], test_patch=new_only,
                                         FAIL_TO_PASS=json.dumps(["tests/test_new.py::test_new"]), PASS_TO_PASS="[]"))
    agent_file = "diff --git a/tests/test_new.py b/tests/test_new.py\nnew file mode 100644\n--- /dev/null\n" \
                 "+++ b/tests/test_new.py\n@@ -0,0 +1,2 @@\n+def test_new():\n+    pass\n"
    outcome = asyncio.run(verify_patch(_agent(task), agent_file, "swe-add-only"))
    assert outcome.status == "unresolved" and outcome.fail_to_pass == {"tests/test_new.py::test_new": "FAILED"}
    gold = asyncio.run(verify_patch(_agent(task), tiny_task["gold"] + agent_file, "swe-add-only-gold"))
    assert gold.status == "resolved", gold.log_tail[-3000:]


def test_a_timeout_is_reported_as_such(tiny_task):
    from uni_agent.grading import verify_patch

    agent = _agent(tiny_task, eval_timeout=10)
    sleepy = "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n" \
             "@@ -0,0 +1,2 @@\n+import time\n+time.sleep(60)\n"
    outcome = asyncio.run(verify_patch(agent, sleepy, "swe-timeout"))
    assert outcome.status == "timeout" and outcome.reward == 0.0 and outcome.patch_applied
    assert ">>>>> Start Test Output" in outcome.log_tail  # the log up to the timeout is kept
    assert outcome.seconds < 30


# ------------------------------------------------------------------------- gold/empty at scale, with resume

def _rows(task, count):
    from uni_agent.swebench.instances import normalize_instance
    from uni_agent.swebench.preprocess import instance_to_row

    rows = []
    for k in range(count):
        meta = dict(task["metadata"], instance_id=f"pallets__flask-9000{k}", problem_statement="add() subtracts")
        # a row on the host's filesystem (--local-repos), the repository being the tiny task's
        row = instance_to_row(normalize_instance(meta), "local", local_repos=task["repo"])
        row["extra_info"]["tools_kwargs"]["env"]["deployment"]["repo"] = str(task["repo"])
        row["extra_info"]["tools_kwargs"]["env"]["env_variables"] = {"PIP_NO_INDEX": "1"}
        row["extra_info"]["tools_kwargs"]["reward"]["eval_timeout"] = 120
        rows.append(row)
    return rows


def test_parallel_gold_verification_buckets_and_resumes(tiny_task, tmp_path, dask_client):
    import pandas as pd

    from conftest import AGENT_CONFIG
    from uni_agent.driver.verify import verify_all

    rows = _rows(tiny_task, 3)
    rows[2]["extra_info"]["tools_kwargs"]["reward"]["metadata"]["patch"] = "not a diff\n"
    out = tmp_path / "verify"
    common = dict(agent_config=str(AGENT_CONFIG), output_dir=str(out), scheduler_address=dask_client.scheduler.address)
    first = verify_all(rows[:2], patch="gold", **common)
    assert first.summary["resolved_ids"] == ["pallets__flask-90000", "pallets__flask-90001"]
    before = pd.read_parquet(out / "verify_gold.parquet")
    # an errored record from an interrupted run is redone; graded ones are kept as they are
    errored = before.iloc[[1]].assign(bucket="timeout_or_error", status="error", reward=0.0)
    pd.concat([before.iloc[[0]], errored]).to_parquet(out / "verify_gold.parquet", index=False)
    second = verify_all(rows, patch="gold", **common)
    after = pd.read_parquet(out / "verify_gold.parquet").set_index("instance_id")
    assert list(after.index) == ["pallets__flask-90000", "pallets__flask-90001", "pallets__flask-90002"]
    assert after.loc["pallets__flask-90000", "verify_s"] == before.iloc[0]["verify_s"]  # not run again
    assert second.summary["resolved_ids"] == ["pallets__flask-90000", "pallets__flask-90001"]
    assert second.summary["wrong_answer_ids"] == ["pallets__flask-90002"]  # the broken gold patch
    assert after.loc["pallets__flask-90002", "status"] == "patch_failed"
    summary = json.loads((out / "summary.json").read_text())
    assert summary == second.summary and summary["exit_reasons"] == {
        "resolved": 2, "wrong_answer": 1, "timeout_or_error": 0}


def test_parallel_verify_swe_script_resumes(tiny_task, tmp_path):
    """The example script as a user runs it: its own LocalCluster, then a rerun that resumes."""
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from conftest import REPO_ROOT

    data = tmp_path / "swe_bench_verified_local.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(tiny_task, 2)), data)
    script = REPO_ROOT / "examples" / "agent_interaction" / "parallel_verify_swe.py"
    command = [sys.executable, str(script), "--data-path", str(data), "--output-dir", str(tmp_path / "out"),
               "--eval-timeout", "300", "--local-workers", "1"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["resolved_ids"] == ["pallets__flask-90000", "pallets__flask-90001"] and summary["patch"] == "gold"
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming: 2 instances already graded" in again.stderr and "dask dashboard" not in again.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["resolved_ids"] == summary["resolved_ids"]


def test_swe_bench_grader_in_a_podman_container(tiny_task):
    """The same flow in a container (podman + runc, the locally built test image: repo copied to /testbed).
    The official SWE-bench images themselves cannot be pulled here."""
    from container_image import image_for_tests
    from uni_agent.grading import verify_patch

    image, _ = image_for_tests()  # a failure where it could be built; a skip where only root could
    from uni_agent import AgentConfigs

    kwargs = {"env": {"deployment": {"type": "podman", "image": image, "repo": str(tiny_task["repo"]),
                                     "pull": "never"}},
              "reward": {"name": "swe_bench", "metadata": tiny_task["metadata"], "eval_timeout": 300}}
    agents = AgentConfigs({"swe_agent": {"name": "swe_agent", "env": {"deployment": {"type": "podman"}}}}, "test")
    agent = agents.for_row("swe_agent", kwargs, "test")
    gold = asyncio.run(verify_patch(agent, tiny_task["gold"], "swe-podman-gold"))
    assert gold.status == "resolved", (gold.error, gold.log_tail[-3000:])
    assert gold.report[tiny_task["metadata"]["instance_id"]]["resolved"] is True
    tamper = asyncio.run(verify_patch(agent, tiny_task["tamper"], "swe-podman-tamper"))
    assert tamper.status == "unresolved" and tamper.fail_to_pass["tests/test_calc.py::test_add"] == "FAILED"
