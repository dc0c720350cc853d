"""Task data from the wild: tasks whose tests already live in the repository (an empty test_patch), test lists
stored as JSON strings, and the SWE-Gym, SWE-rebench and SWE-smith preprocessors and graders, each on fixture rows
in the dataset's published schema (tests/fixtures/swe_gym, swe_rebench, swe_smith; no network).

Real parts: the graders run in bubblewrap sandboxes on real code (tests/fixtures/swe_smith_like: a bug injected into
the source of a small package, FAIL_TO_PASS tests in its tests/; and a small SWE-rebench-style repository made
here). The official pieces are the installed swebench 4.1.0: our eval scripts and reports for rows that carry their
own spec (SWE-rebench's install_config, SWE-Gym's spec file) are compared with the package's own functions given the
same spec, which is what SWE-rebench's and SWE-Gym's harness forks do.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from uni_agent.config import AgentConfigs, ConfigError
from uni_agent.driver.dataset import build_specs, read_rows
from uni_agent.swebench import smith
from uni_agent.swebench.instances import load_specs, read_instances
from uni_agent.swebench.preprocess import build_rows, preprocess
from uni_agent.tasks.swe_form import convert, load_instance

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
SMITH_LIKE = FIXTURES / "swe_smith_like"
SMITH_TASK = SMITH_LIKE / "uni-agent__slugkit-1"
SMITH = FIXTURES / "swe_smith"
GYM = FIXTURES / "swe_gym"
REBENCH = FIXTURES / "swe_rebench"
AGENT_CONFIG = REPO_ROOT / "examples" / "agent_interaction" / "agent_config_local.yaml"
F2P = ["tests/test_slugify.py::test_basic", "tests/test_slugify.py::test_edges_trimmed",
       "tests/test_truncate.py::test_exact_boundary_keeps_word"]

# An answer that makes the FAIL_TO_PASS tests pass by rewriting them, without fixing anything.
TAMPER = """diff --git a/tests/test_truncate.py b/tests/test_truncate.py
--- a/tests/test_truncate.py
+++ b/tests/test_truncate.py
@@ -10,7 +10,7 @@ def test_cut_at_word_boundary():
 
 
 def test_exact_boundary_keeps_word():
-    assert truncate_slug("the-quick-brown-fox", 15) == "the-quick-brown"
+    assert True
 
 
 def test_unslugify():
"""

def _agents() -> AgentConfigs:
    return AgentConfigs.load(AGENT_CONFIG)


def _agent_for(row: dict, **reward):
    kwargs = json.loads(json.dumps(row["extra_info"]["tools_kwargs"]))
    kwargs["reward"].update({"eval_timeout": 120, **reward})
    return _agents().for_row(row["agent_name"], kwargs, row["instance_id"])


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


# ---- instance.json: test lists as JSON strings, no test patch ----

def test_instance_json_accepts_json_encoded_test_lists(tmp_path):
    instance = load_instance(SMITH_TASK)
    assert isinstance(json.loads((SMITH_TASK / "instance.json").read_text())["FAIL_TO_PASS"], str)  # as stored
    assert instance["FAIL_TO_PASS"] == F2P and len(instance["PASS_TO_PASS"]) == 5
    out = tmp_path / "rows.parquet"
    assert convert(SMITH_LIKE, out) == 1
    metadata = pq.read_table(out).to_pylist()[0]["extra_info"]["tools_kwargs"]["reward"]["metadata"]
    assert json.loads(metadata["FAIL_TO_PASS"]) == F2P  # never a list of characters
    assert metadata["test_patch"] == ""


@pytest.mark.parametrize("value, message", [
    ("tests/test_slugify.py::test_basic", "FAIL_TO_PASS is not a JSON list of test ids (a string that does not parse)"),
    (5, "FAIL_TO_PASS must be a list of test ids or a JSON string of one, got int"),
    ('[1, 2]', "FAIL_TO_PASS must hold test ids as strings"),
    ("[]", "FAIL_TO_PASS is empty"),
])
def test_instance_json_bad_test_lists_name_the_file_and_field(tmp_path, value, message):
    task = tmp_path / "t" / "task-1"
    shutil.copytree(SMITH_TASK, task)
    data = json.loads((task / "instance.json").read_text())
    data["FAIL_TO_PASS"] = value
    (task / "instance.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=re.escape(f"{task / 'instance.json'}: {message}")):
        load_instance(task)


def test_a_row_with_a_bad_test_list_is_reported_and_the_run_goes_on(tmp_path):
    out = tmp_path / "rows.parquet"
    convert(SMITH_LIKE, out)
    good = pq.read_table(out).to_pylist()[0]
    bad = json.loads(json.dumps(good))
    bad["instance_id"] = bad["extra_info"]["instance_id"] = "broken-1"
    bad["extra_info"]["tools_kwargs"]["reward"]["metadata"]["PASS_TO_PASS"] = "tests/a.py::t"
    specs, problems = build_specs([bad, good], _agents(), "run", 1)
    assert [s.instance_id for s in specs] == [good["instance_id"]]
    assert len(problems) == 1 and problems[0].instance_id == "broken-1"
    assert "rows row 0 (instance_id=broken-1): reward.metadata.PASS_TO_PASS is not a JSON list" \
        in problems[0].error


@pytest.mark.parametrize("answer, reward", [("gold", 1.0), ("empty", 0.0), ("tamper", 0.0)])
def test_tests_in_the_repository_grade_gold_1_empty_0(tmp_path, answer, reward):
    """The issue's case: no test patch, FAIL_TO_PASS are tests already in repo/; graded for real in bubblewrap."""
    from uni_agent.grading import verify_patch, verify_reference

    out = tmp_path / "rows.parquet"
    convert(SMITH_LIKE, out)
    agent = _agent_for(pq.read_table(out).to_pylist()[0])
    answering = verify_patch(agent, TAMPER, "tamper") if answer == "tamper" else verify_reference(agent, answer)
    outcome = asyncio.run(answering)
    assert outcome.error is None and outcome.patch_applied, (outcome.status, outcome.error, outcome.log_tail)
    assert outcome.reward == reward, outcome.log_tail[-2000:]
    if answer == "gold":
        assert set(outcome.fail_to_pass.values()) == {"PASSED"} and set(outcome.pass_to_pass.values()) == {"PASSED"}
    else:  # the tampered test file was reset: the real test ran, and failed against the bug
        assert outcome.fail_to_pass["tests/test_truncate.py::test_exact_boundary_keeps_word"] == "FAILED"
        assert set(outcome.pass_to_pass.values()) == {"PASSED"}


# ---- SWE-smith ----

def test_reverse_of_the_bug_patch_is_the_gold_answer(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(SMITH / "repos" / "uni-agent__slugkit.0f1e2d3c", repo)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "clean")
    bug = json.loads((SMITH / "rows.jsonl").read_text().splitlines()[0])["patch"]
    (tmp_path / "bug.diff").write_text(bug)
    (tmp_path / "gold.diff").write_text(smith.reverse_patch(bug))
    _git(repo, "apply", str(tmp_path / "bug.diff"))
    assert _git(repo, "status", "--porcelain").strip() == "M slugkit/core.py"
    _git(repo, "apply", str(tmp_path / "gold.diff"))
    assert _git(repo, "status", "--porcelain").strip() == ""  # back to the clean repository
    assert smith.reverse_patch(smith.reverse_patch(bug)) == bug
    with pytest.raises(ConfigError, match="cannot reverse 'new file mode 100644'"):
        smith.reverse_patch("diff --git a/n.py b/n.py\nnew file mode 100644\n--- /dev/null\n+++ b/n.py\n")


def test_swe_smith_rows_for_every_deployment_and_bad_rows(tmp_path):
    raw = read_instances(SMITH / "rows.jsonl")
    for deployment in ("modal", "docker", "podman", "local"):
        rows, problems = build_rows(raw, deployment, source="swe_smith", local_repos=SMITH / "repos")
        assert [r["instance_id"] for r in rows] == [
            "uni-agent__slugkit.0f1e2d3c.func_pm__k2v9", "uni-agent__slugkit.0f1e2d3c.func_pm__k2v9-jsonlists"]
        assert [str(p) for p in problems] == [
            "row 2 (instance_id=uni-agent__slugkit.0f1e2d3c.bad_noimage): missing fields ['image_name']",
            "row 3 (instance_id=uni-agent__slugkit.0f1e2d3c.bad_f2p): FAIL_TO_PASS is not a JSON list of test ids "
            "(a string that does not parse): Expecting value: line 1 column 1 (char 0)",
            "row 4 (instance_id=uni-agent__slugkit.0f1e2d3c.bad_parser): log_parser 'parse_log_go' is not known; "
            "choose one of pytest_verbose, pytest_summary"]
        row = rows[0]
        assert row["data_source"] == "swe_smith"
        env, reward = row["extra_info"]["tools_kwargs"]["env"], row["extra_info"]["tools_kwargs"]["reward"]
        assert reward["name"] == "swe_smith" and json.loads(reward["metadata"]["FAIL_TO_PASS"]) == F2P
        assert reward["metadata"]["bug_patch"] == raw[0]["patch"]
        assert reward["metadata"]["patch"] == smith.reverse_patch(raw[0]["patch"])
        assert "base64 -d" in env["post_setup_cmd"]  # the agent starts at the task state
        if deployment == "local":
            assert env["deployment"] == {"type": "local", "workdir": "/testbed",
                                         "repo": str((SMITH / "repos" / "uni-agent__slugkit.0f1e2d3c").resolve())}
        else:
            assert env["deployment"] == {"type": deployment,
                                         "image": "swebench/swesmith.x86_64.uni-agent_1776_slugkit.0f1e2d3c"}
    rows, problems = build_rows(raw, "vefaas", source="swe_smith")
    assert rows == [] and "image_name 'swebench/swesmith.x86_64.uni-agent_1776_slugkit.0f1e2d3c' cannot be used " \
        "for deployment vefaas" in problems[0].error
    path, count, _ = preprocess(tmp_path, SMITH / "rows.jsonl", "docker", source="swe_smith")
    assert (path.name, count) == ("swe_smith_docker.parquet", 2)


def _smith_rows() -> list[dict]:
    rows, _ = build_rows(read_instances(SMITH / "rows.jsonl"), "local", source="swe_smith",
                         local_repos=SMITH / "repos")
    return rows


@pytest.mark.parametrize("answer, reward", [("gold", 1.0), ("empty", 0.0), ("tamper", 0.0), ("garbage", 0.0)])
def test_swe_smith_grader_in_a_bubblewrap_sandbox(answer, reward):
    from uni_agent.grading import verify_patch, verify_reference

    agent = _agent_for(_smith_rows()[1])  # the row whose test lists were JSON strings
    if answer in ("gold", "empty"):
        outcome = asyncio.run(verify_reference(agent, answer))
    else:
        garbage = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
        outcome = asyncio.run(verify_patch(agent, TAMPER if answer == "tamper" else garbage))
    assert outcome.reward == reward, (outcome.error, outcome.log_tail[-3000:])
    if answer == "garbage":
        assert outcome.status == "patch_failed" and "patch --batch --fuzz=5 -p1 -i" in outcome.log_tail
        return
    assert outcome.status == ("resolved" if reward else "unresolved"), outcome.error
    assert "+ : '>>>>> Start Test Output'" in outcome.log_tail
    assert outcome.report["tests_status"]["FAIL_TO_PASS"]["success" if reward else "failure"]
    if answer == "gold":
        assert set(outcome.fail_to_pass.values()) == {"PASSED"}
    else:
        assert outcome.fail_to_pass["tests/test_truncate.py::test_exact_boundary_keeps_word"] == "FAILED"


def test_swe_smith_agent_starts_at_the_task_state():
    """The row's post_setup_cmd puts the bug in and removes the FAIL_TO_PASS test files, each committed (SWE-smith's
    branch tip): the agent sees the bug, not the failing tests, and its diff starts empty."""
    from uni_agent.episode.agent_loop import start_sandbox, workspace_patch

    agent = _agent_for(_smith_rows()[0])

    async def go():
        sandbox = await start_sandbox(agent, "smith-state")
        try:
            setup = await sandbox.exec(agent.env.post_setup_cmd, 60)
            assert setup.exit_code == 0, setup.output
            core = await sandbox.exec("cat slugkit/core.py; ls tests", 10)
            return core.output, await workspace_patch(sandbox)
        finally:
            await sandbox.close()

    core, patch = asyncio.run(go())
    assert "cut = slug[:max_length]" in core and patch == ""
    assert "test_slugify.py" not in core and "test_truncate.py" not in core  # both hold FAIL_TO_PASS tests


@pytest.mark.parametrize("log, resolved", [
    # every FAIL_TO_PASS / PASS_TO_PASS test passes
    ("a.py::f PASSED\na.py::p PASSED\n", True),
    # a test missing from the log fails (the released swesmith's rule, as SWE-bench's)
    ("a.py::f PASSED\n", False),
    # SKIPPED counts neither way; FAILED and ERROR fail
    ("a.py::f PASSED\na.py::p SKIPPED\n", True),
    ("a.py::f FAILED\na.py::p PASSED\n", False),
    ("a.py::f ERROR\na.py::p PASSED\n", False),
    ("a.py::f PASSED\na.py::p FAILED\n", False),
])
def test_swe_smith_grading_rule_on_logs(log, resolved):
    meta = {"FAIL_TO_PASS": '["a.py::f"]', "PASS_TO_PASS": '["a.py::p"]'}
    traced = f"+ : '>>>>> Start Test Output'\n+ pytest\n{log}+ : '>>>>> End Test Output'\n"
    assert smith.grade_log(meta, traced).resolved is resolved
    assert smith.grade_log(meta, log).resolved is False  # no markers: no results
    assert smith.grade_log(meta, traced + "\n>>>>> Tests Timed Out\n").resolved is False


def test_swe_smith_counts_tests_missing_from_the_log_as_failed():
    """A run whose test files could not even be imported (a real log of the fixture task without its pytest.ini)
    reports no test: every test is missing, and fails. Older SWE-smith sources counted missing tests as passed (this
    log would resolve); the released package (0.0.9) does not: crosscheck_swesmith.py checks this log too."""
    meta = _smith_rows()[0]["extra_info"]["tools_kwargs"]["reward"]["metadata"]
    grade = smith.grade_log(meta, (SMITH / "logs" / "collection_error.log").read_text())
    assert grade.tests_found and grade.status_map == {} and not grade.resolved
    assert set(grade.fail_to_pass.values()) == {"MISSING"}
    assert grade.tests_status["FAIL_TO_PASS"]["failure"] == json.loads(meta["FAIL_TO_PASS"])


# ---- SWE-Gym and SWE-rebench: the SWE-bench grader with the row's own spec ----

def test_swe_gym_rows_images_specs_and_bad_rows():
    raw = read_instances(GYM / "rows.jsonl")
    rows, problems = build_rows(raw, "podman", source="swe_gym", specs=load_specs(GYM / "specs.json"),
                                image_registry="docker.io")
    assert [r["extra_info"]["tools_kwargs"]["env"]["deployment"]["image"] for r in rows] == [
        "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752",
        "docker.io/xingyaoww/sweb.eval.x86_64.project-monai_s_monai-3715"]
    assert {r["data_source"] for r in rows} == {"swe_gym"}
    meta = rows[0]["extra_info"]["tools_kwargs"]["reward"]["metadata"]
    assert json.loads(meta["spec"]) == {"test_cmd": "pytest -n0 -rA", "log_parser": "parse_log_pytest"}
    assert len(problems) == 2
    assert problems[0].instance_id == "iterative__dvc-1" and "repo/version iterative/dvc 0.1: no test spec" \
        in problems[0].error and "--specs FILE" in problems[0].error
    assert str(problems[1]) == "row 3 (instance_id=getmoto__moto-2): missing fields ['test_patch']"
    rows, problems = build_rows(raw, "vefaas", source="swe_gym", specs=load_specs(GYM / "specs.json"))
    assert rows == [] and "instance_id: the image 'xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752' cannot be used " \
        "for deployment vefaas" in problems[0].error


def test_swe_rebench_rows_images_install_config_and_bad_rows():
    rows, problems = build_rows(read_instances(REBENCH / "rows.jsonl"), "modal", source="swe_rebench")
    assert [r["extra_info"]["tools_kwargs"]["env"]["deployment"]["image"] for r in rows] == [
        "swerebench/sweb.eval.x86_64.oemof_1776_tespy-653",  # the row's docker_image
        "swerebench/sweb.eval.x86_64.tox-dev_1776_tox-3810"]  # SWE-rebench's naming, without one
    assert {r["data_source"] for r in rows} == {"swe_rebench"}
    assert [(p.instance_id, p.error) for p in problems] == [
        ("acme__widget-1", "missing field install_config (SWE-rebench's per-instance test command and parser)"),
        ("acme__widget-2", "log_parser 'parse_log_nonesuch' is not a swebench log parser (known: "
         + problems[1].error.split("(known: ")[1]),
        ("acme__widget-3", "install_config.test_cmd must be a non-empty string (the test command), got NoneType"),
    ]
    assert "parse_log_pytest_v2" in problems[1].error


def test_swe_gym_mypy_rows_select_the_cases_of_the_test_patch():
    """SWE-Gym's harness runs python/mypy's data-driven cases named in the test patch (`-k "a or b"`)."""
    from uni_agent.swebench.spec import eval_script

    test_patch = ("diff --git a/test-data/unit/check-final.test b/test-data/unit/check-final.test\n"
                  "--- a/test-data/unit/check-final.test\n+++ b/test-data/unit/check-final.test\n"
                  "@@ -1,1 +1,5 @@\n [case testOld]\n+[case testFinalNew]\n+x = 1\n+[case testFinalOther]\n+y = 2\n")
    raw = {"instance_id": "python__mypy-15000", "repo": "python/mypy", "version": "1.4", "base_commit": "a" * 40,
           "patch": "diff --git a/mypy/a.py b/mypy/a.py\n--- a/mypy/a.py\n+++ b/mypy/a.py\n@@ -1 +1 @@\n-a\n+b\n",
           "test_patch": test_patch, "problem_statement": "p", "FAIL_TO_PASS": ["mypy/test/testcheck.py::x"],
           "PASS_TO_PASS": []}
    specs = {"python/mypy": {"*": {"test_cmd": "pytest -n0 -rA -k", "log_parser": "parse_log_pytest"}}}
    rows, problems = build_rows([raw], "docker", source="swe_gym", specs=specs)
    assert problems == []
    script = eval_script(rows[0]["extra_info"]["tools_kwargs"]["reward"]["metadata"])
    # every case the diff names, context lines included, as SWE-Gym's harness finds them
    assert '\npytest -n0 -rA -k "testOld or testFinalNew or testFinalOther"\n' in script


def _register(monkeypatch, instance: dict, spec: dict) -> None:
    """Put a row's spec where swebench 4.1.0 looks (what SWE-rebench's and SWE-Gym's forks add)."""
    from swebench.harness import constants, log_parsers
    from swebench.harness.test_spec import create_scripts, python
    from uni_agent.swebench.spec import log_parser

    versions = dict(constants.MAP_REPO_VERSION_TO_SPECS.get(instance["repo"], {}))
    versions[instance["version"]] = spec
    for module in (constants, python, create_scripts):
        if hasattr(module, "MAP_REPO_VERSION_TO_SPECS"):
            monkeypatch.setitem(module.MAP_REPO_VERSION_TO_SPECS, instance["repo"], versions)
    for module in (constants, create_scripts):
        if hasattr(module, "MAP_REPO_TO_EXT"):
            monkeypatch.setitem(module.MAP_REPO_TO_EXT, instance["repo"], "py")
    import swebench.harness.grading as official_grading
    for table in (log_parsers.MAP_REPO_TO_PARSER, getattr(official_grading, "MAP_REPO_TO_PARSER", {})):
        monkeypatch.setitem(table, instance["repo"], log_parser(instance))


def _spec_rows() -> list[dict]:
    gym, _ = build_rows(read_instances(GYM / "rows.jsonl"), "docker", source="swe_gym",
                        specs=load_specs(GYM / "specs.json"))
    rebench, _ = build_rows(read_instances(REBENCH / "rows.jsonl"), "docker", source="swe_rebench")
    return [r["extra_info"]["tools_kwargs"]["reward"]["metadata"] for r in gym + rebench]


@pytest.mark.parametrize("index", range(4))
def test_row_spec_eval_script_and_grades_equal_the_package(monkeypatch, tmp_path, index):
    """For rows with their own spec: our eval script equals swebench's make_eval_script_list and our report equals
    get_eval_report's, once the spec and parser are where the package looks (where the harness forks put them);
    the gold log resolves, the empty one does not."""
    from swebench.harness.grading import get_eval_report
    from swebench.harness.test_spec.create_scripts import make_eval_script_list
    from uni_agent.swebench.grading import grade_log
    from uni_agent.swebench.spec import ENV_NAME, WORKDIR, eval_script_list, official_test_spec, repo_spec

    instance = _spec_rows()[index]
    spec = repo_spec(instance)
    _register(monkeypatch, instance, spec)
    official = make_eval_script_list(dict(instance), spec, ENV_NAME, WORKDIR, instance["base_commit"],
                                     instance["test_patch"])
    assert eval_script_list(instance) == official
    f2p, p2p = json.loads(instance["FAIL_TO_PASS"]), json.loads(instance["PASS_TO_PASS"])
    for kind, status in (("gold", "PASSED"), ("empty", "FAILED")):
        log = (">>>>> Start Test Output\n" + "".join(f"{status} {t}\n" for t in f2p)
               + "".join(f"PASSED {t}\n" for t in p2p) + ">>>>> End Test Output\n")
        path = tmp_path / f"{kind}.log"
        path.write_text(log)
        prediction = {"instance_id": instance["instance_id"], "model_name_or_path": "m", "model_patch": "x"}
        theirs = get_eval_report(official_test_spec(instance), prediction, str(path), include_tests_status=True)
        ours = grade_log(instance, log).report("x")
        assert ours == theirs
        assert ours[instance["instance_id"]]["resolved"] is (kind == "gold")


def test_row_spec_script_builder_equals_the_package_on_verified_rows():
    """The builder used for rows with their own spec reproduces swebench's script for every Verified fixture row
    given the package's table spec."""
    from swebench.harness.test_spec.create_scripts import make_eval_script_list
    from uni_agent.swebench.spec import ENV_NAME, WORKDIR, python_eval_script_list, repo_spec

    checked = 0
    for line in (FIXTURES / "swebench" / "instances.jsonl").read_text().splitlines():
        row = json.loads(line)
        spec = repo_spec(row)
        official = make_eval_script_list(row, spec, ENV_NAME, WORKDIR, row["base_commit"], row["test_patch"])
        assert python_eval_script_list(row, spec) == official, row["instance_id"]
        checked += 1
    assert checked >= 10


@pytest.fixture(scope="module")
def rebench_task(tmp_path_factory):
    """A small repository in SWE-rebench form: the spec comes from install_config, not swebench's table."""
    repo = tmp_path_factory.mktemp("rebench") / "acme__calc-7"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n")
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base_commit = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    gold = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n\n\ndef test_add():\n"
        "    assert add(2, 3) == 5\n")
    test_patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    raw = {"instance_id": "acme__calc-7", "repo": "acme/calc", "version": "0.1", "base_commit": base_commit,
           "patch": gold, "test_patch": test_patch, "problem_statement": "add subtracts",
           "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
           "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_zero"]),
           "install_config": {"install": "true", "log_parser": "parse_log_pytest",
                              "test_cmd": "python -m pytest -rA -p no:cacheprovider"}}
    rows, problems = build_rows([raw], "local", source="swe_rebench", local_repos=repo.parent)
    assert problems == []
    return rows[0]


@pytest.mark.parametrize("answer, reward", [("gold", 1.0), ("empty", 0.0)])
def test_swe_rebench_row_graded_for_real_in_bubblewrap(rebench_task, answer, reward):
    from uni_agent.grading import verify_reference

    outcome = asyncio.run(verify_reference(_agent_for(rebench_task), answer))
    assert outcome.reward == reward, (outcome.error, outcome.log_tail[-3000:])
    # install_config's test command, with the locale SWE-rebench's harness puts in front (xtrace shows it apart)
    assert "+ LC_ALL=C.UTF-8\n+ python -m pytest -rA -p no:cacheprovider tests/test_calc.py" in outcome.log_tail
    assert outcome.fail_to_pass == {"tests/test_calc.py::test_add": "PASSED" if reward else "FAILED"}


# ---- every source in one run ----

def test_rows_of_every_source_mix_in_one_run(tmp_path):
    """Verified, SWE-Gym, SWE-rebench, SWE-smith and a repository task in one Parquet file: every row becomes
    rollouts with its own grader and spec; a bad row is reported and the rest go on; the two that run here grade
    gold 1 through the mixed file."""
    from uni_agent.grading import verify_reference

    verified, _ = build_rows(read_instances(FIXTURES / "swebench" / "instances.jsonl"), "local")
    gym, _ = build_rows(read_instances(GYM / "rows.jsonl"), "local", source="swe_gym",
                        specs=load_specs(GYM / "specs.json"))
    rebench, _ = build_rows(read_instances(REBENCH / "rows.jsonl"), "local", source="swe_rebench")
    smith_rows = _smith_rows()
    convert(SMITH_LIKE, tmp_path / "local.parquet")
    local = pq.read_table(tmp_path / "local.parquet").to_pylist()
    broken = json.loads(json.dumps(rebench[0]))
    broken["instance_id"] = broken["extra_info"]["instance_id"] = "broken__row-1"
    broken["extra_info"]["tools_kwargs"]["reward"]["metadata"]["install_config"] = '{"test_cmd": "pytest"}'
    rows = verified[:2] + gym + rebench + smith_rows + local + [broken]
    # One file: the metadata's columns are the union of the sources' (absent ones read back as None).
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mixed.parquet")
    read = read_rows(tmp_path / "mixed.parquet")
    specs, problems = build_specs(read, _agents(), "mixed", 1, source="mixed.parquet")
    assert [p.instance_id for p in problems] == ["broken__row-1"]
    assert "install_config.log_parser must name a swebench log parser" in problems[0].error
    assert {s.data_source for s in specs} == {"swe_bench_verified", "swe_gym", "swe_rebench", "swe_smith",
                                              "uni-agent/local"}
    assert len(specs) == len(rows) - 1
    by_id = {r["instance_id"]: r for r in read}
    for spec in specs:
        if spec.data_source in ("swe_smith", "uni-agent/local") and not spec.instance_id.endswith("jsonlists"):
            outcome = asyncio.run(verify_reference(spec.agent, "gold"))
            assert outcome.reward == 1.0, (spec.instance_id, outcome.error, outcome.log_tail[-2000:])
            assert by_id[spec.instance_id]["data_source"] == spec.data_source


@pytest.mark.parametrize("script, extra, written, skipped", [
    ("swe_gym.py", ["--specs", str(GYM / "specs.json")], 2, 2),
    ("swe_rebench.py", [], 2, 3),
    ("swe_smith.py", [], 2, 3),
])
def test_preprocessing_scripts(tmp_path, script, extra, written, skipped):
    import sys

    source = script.removesuffix(".py")
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "data_preprocess" / script), "--local-save-dir", str(tmp_path),
         "--input", str(FIXTURES / source / "rows.jsonl"), "--deployment", "podman", *extra],
        capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    out = tmp_path / f"{source}_podman.parquet"
    assert f"wrote {written} instances to {out} ({skipped} malformed rows skipped)" in done.stdout
    assert len([line for line in done.stderr.splitlines() if line.startswith("skipped malformed row")]) == skipped
    assert {r["data_source"] for r in read_rows(out)} == {source}


def test_mixed_sources_verify_gold_in_one_dask_run(tmp_path, rebench_task, dask_client):
    """One real gold-check run (Dask LocalCluster, bubblewrap) over a file mixing a SWE-smith row, a SWE-rebench row,
    a repository task and a Verified row whose repository is not on this machine: the first three resolve with their
    own graders; the Verified one is an error of its own, and the run goes on."""
    from uni_agent.driver.verify import verify_all

    convert(SMITH_LIKE, tmp_path / "local.parquet")
    verified, _ = build_rows(read_instances(FIXTURES / "swebench" / "instances.jsonl"), "local")
    rows = [_smith_rows()[0], rebench_task, *pq.read_table(tmp_path / "local.parquet").to_pylist(), verified[0]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mixed.parquet")
    outcome = verify_all(str(tmp_path / "mixed.parquet"), AGENT_CONFIG, patch="gold",
                         output_dir=str(tmp_path / "gold"), scheduler_address=dask_client.scheduler.address,
                         progress=False)
    summary = outcome.summary
    assert summary["resolved_ids"] == sorted(r["instance_id"] for r in rows[:3]), summary
    assert summary["timeout_or_error_ids"] == [verified[0]["instance_id"]], summary
