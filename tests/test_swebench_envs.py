"""`uni-agent envs build`: SWE-bench environments from the official specs (uni_agent/envs/).

Always run (no network, no repositories): the plan made from real Verified rows of the project's own preprocessor
(tests/fixtures/swebench_verified/, 12 instances over 6 repositories), the requirements file as the official harness
reads it, rows that cannot get an environment, a missing interpreter, the `conda activate` stand-in.

End to end, when the repositories' mirrors are here (UNI_AGENT_SWEBENCH_MIRRORS, default /work/.mirror) and PyPI is
reachable for the first build: two real instances (psf__requests-1142, pytest-dev__pytest-10051) get their
environments built, the gold patch resolves, the empty patch does not, and the official swebench 4.1.0 report of
each whole eval log equals ours. The whole set: cluster/swebench_verified.py. A broken environment graded as infra:
tests/test_swebench_infra.py.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from uni_agent.config import ConfigError
from uni_agent.envs.interpreters import Interpreter, find_python
from uni_agent.envs.isolation import ACTIVATE_SHIM
from uni_agent.envs.plan import plan_rows, requirements_text
from uni_agent.swebench.preprocess import build_rows

REPO_ROOT = Path(__file__).resolve().parent.parent
RECORDS = REPO_ROOT / "tests" / "fixtures" / "swebench_verified" / "instances.jsonl"
INSTANCES = [json.loads(line) for line in RECORDS.read_text().splitlines()]
MIRRORS = Path(os.environ.get("UNI_AGENT_SWEBENCH_MIRRORS", "/work/.mirror"))
END_TO_END = ["psf__requests-1142", "pytest-dev__pytest-10051"]


def local_rows(instances, tmp_path):
    rows, problems = build_rows(instances, "local", local_repos=tmp_path / "repos")
    assert problems == []
    return rows


def test_fixture_records_cover_six_repositories():
    assert len(INSTANCES) >= 12
    assert len({record["repo"] for record in INSTANCES}) >= 6
    for record in INSTANCES:
        assert json.loads(record["FAIL_TO_PASS"]), record["instance_id"]
        assert record["test_patch"].startswith("diff --git") and record["patch"].startswith("diff --git")


def test_plan_one_environment_per_repo_version(tmp_path):
    plan = plan_rows(local_rows(INSTANCES, tmp_path), requirements_paths=lambda repo: ["requirements.txt"])
    assert plan.problems == []
    assert sorted(env.label for env in plan.envs.values()) == sorted(
        {f"{r['repo']} {r['version']}" for r in INSTANCES})
    assert len(plan.instances) == len(INSTANCES)
    pytest_rows = [i for i in plan.instances.values() if i.repo == "pytest-dev/pytest"]
    assert len(pytest_rows) == 3 and len({i.env.key for i in pytest_rows}) == 1  # shared, built once
    by_label = {env.label: env for env in plan.envs.values()}
    flask, sphinx = by_label["pallets/flask 2.3"], by_label["sphinx-doc/sphinx 5.0"]
    assert (flask.python, flask.packages) == ("3.11", "requirements.txt")
    assert sphinx.pre_install == ("sed -i 's/pytest/pytest -rA/' tox.ini",)
    script = sphinx.build_script(None)
    lines = script.splitlines()
    assert lines[1:3] == ["source /opt/miniconda3/bin/activate && conda activate testbed",
                          "python -m ensurepip --default-pip"]
    assert "python -m pip install tox==4.16.0 tox-current-env==0.0.11 Jinja2==3.0.3" in lines
    assert lines[-2:] == ["sed -i 's/pytest/pytest -rA/' tox.ini", "python -m pip install -e .[test]"]
    with pytest.raises(ConfigError, match="no requirements file"):
        flask.build_script(None)
    assert "python -m pip install -r" in flask.build_script("click==8.1.3\n")
    instance = next(i for i in plan.instances.values() if i.instance_id == "sphinx-doc__sphinx-10323")
    prepare = instance.prepare_script()
    assert "tox.ini" in prepare and "pip install -e .[test]" in prepare and "tox==4.16.0" not in prepare


def test_environment_key_changes_with_what_the_build_uses(tmp_path):
    record = next(r for r in INSTANCES if r["instance_id"] == "psf__requests-1142")
    first = next(iter(plan_rows(local_rows([record], tmp_path)).envs.values()))
    moved = next(iter(plan_rows(local_rows([{**record, "environment_setup_commit": "0" * 40}], tmp_path))
                      .envs.values()))
    assert first.key.startswith("psf__requests-1.1-") and first.key != moved.key


def test_rows_that_get_no_environment_say_why(tmp_path):
    record = next(r for r in INSTANCES if r["instance_id"] == "psf__requests-1142")
    docker_rows, _ = build_rows([record], "docker")
    conda_record = {**record, "instance_id": "pydata__xarray-1", "repo": "pydata/xarray", "version": "0.12"}
    no_commit = {**record, "instance_id": "psf__requests-2", "environment_setup_commit": ""}
    plan = plan_rows(docker_rows + local_rows([conda_record, no_commit], tmp_path))
    assert plan.envs == {} and plan.instances == {}
    assert "only local rows" in plan.problems[0]
    assert "environment.yml, which needs conda" in plan.problems[1]
    assert "no environment_setup_commit" in plan.problems[2]


def test_requirements_as_the_official_harness_reads_them():
    files = {"requirements/dev.txt": "-r tests.txt\n# pinned\n-e .\nbuild==0.10.0\ntypes-pkg_resources==0.1\n",
             "requirements/tests.txt": "pytest==7.3.0\n.[test]\n"}
    text = requirements_text(files.get, ["requirements.txt", "requirements/dev.txt"])
    assert text.split("\n") == ["pytest==7.3.0", "", "build==0.10.0", "types-setuptools", ""]
    with pytest.raises(ConfigError, match="no requirements file"):
        requirements_text(files.get, ["nowhere.txt"])


def this_python_installed() -> Interpreter:
    """An installation of this test's Python X.Y that find_python takes (uv's, pyenv's, conda's or on PATH outside
    /usr); skips when this user has none: an ordinary user of a Debian machine has only the system's, which
    find_python leaves out by design (root's CI machine has uv's)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        return find_python(version)
    except ConfigError:
        pytest.skip(f"no Python {version} of uv, pyenv or conda for this user (`uv python install {version}`)")


def test_a_missing_python_names_the_version_and_how_to_get_it():
    with pytest.raises(ConfigError, match=r"no Python 2\.5 found .*uv python install 2\.5"):
        find_python("2.5")
    found = this_python_installed()
    assert found.version.startswith(f"{sys.version_info.major}.{sys.version_info.minor}.") and found.needs_mount


def test_conda_stand_in_refuses_what_it_cannot_do(tmp_path):
    shim = tmp_path / "activate"
    shim.write_text(ACTIVATE_SHIM)
    done = subprocess.run(["bash", "-c", f"source {shim}; conda activate no-such-env; echo rc=$?; conda info; "
                           "echo rc=$?"], capture_output=True, text=True)
    assert "rc=1\nrc=1" in done.stdout
    assert "no environment 'no-such-env'" in done.stderr and "only 'conda activate NAME'" in done.stderr


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_build_step_resolves_the_proxy_as_the_builder_does(tmp_path, monkeypatch):
    """The builder's proxy name resolves inside the step as it does outside: here a name only this process can
    resolve, as in CI, where pip inside the sandbox failed on the proxy's name ("Name or service not known") while
    pip outside installed through it. The proxy setting itself reaches the step. A real bubblewrap step."""
    import socket

    from uni_agent.envs import index_access
    from uni_agent.envs.isolation import StepDirs, step_argv

    proxy_name = "uni-agent-test-proxy.invalid"
    real_getaddrinfo = socket.getaddrinfo
    monkeypatch.setattr(index_access.socket, "getaddrinfo", lambda host, *a, **k: (
        [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.9", 0))] if host == proxy_name
        else real_getaddrinfo(host, *a, **k)))
    monkeypatch.setenv("https_proxy", f"http://{proxy_name}:3128")
    interpreter = this_python_installed()
    dirs = StepDirs(tmp_path / "repo", tmp_path / "conda", tmp_path / "scratch", tmp_path / "pip-cache")
    for path in (dirs.repo, dirs.conda_root, dirs.scratch):
        path.mkdir()
    script = f"getent hosts {proxy_name}; echo proxy=$https_proxy"
    done = subprocess.run(step_argv(dirs, interpreter, interpreter.prefix, script, throwaway_env=False),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0].split() == ["127.0.0.9", proxy_name], done.stdout
    assert f"proxy=http://{proxy_name}:3128" in done.stdout
    assert "uni-agent" not in Path("/etc/hosts").read_text()  # the host's own file is untouched
    monkeypatch.delenv("https_proxy")
    plain = subprocess.run(step_argv(dirs, interpreter, interpreter.prefix, script, throwaway_env=False),
                           capture_output=True, text=True, timeout=60)
    assert proxy_name not in plain.stdout  # without a proxy the host's /etc/hosts is the sandbox's


# -- end to end: needs the mirrors (and PyPI for a first build) ----------------------------------------------------
def _mirrors_missing() -> str:
    missing = [repo for repo in ("psf+requests", "pytest-dev+pytest") if not (MIRRORS / repo / "repo").is_dir()]
    return f"no git mirrors of {missing} under {MIRRORS} (UNI_AGENT_SWEBENCH_MIRRORS)" if missing else ""


@pytest.mark.skipif(bool(_mirrors_missing()), reason=_mirrors_missing() or "mirrors present")
def test_real_instances_end_to_end(tmp_path):
    from swebench.harness.grading import get_eval_report
    from swebench.harness.test_spec.test_spec import make_test_spec
    import swebench.harness.test_spec.python as official_python

    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [r for r in INSTANCES if r["instance_id"] in END_TO_END]
    rows = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(local_rows(records, tmp_path)), rows)
    cli = [sys.executable, "-m", "uni_agent.cli"]
    built = subprocess.run([*cli, "envs", "build", str(rows), "--git-mirror", str(MIRRORS), "--jobs", "2"],
                           capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "2 of 2 rows have their environment" in built.stdout
    env_rows = tmp_path / "rows_envs.parquet"
    for row in pq.read_table(env_rows).to_pylist():
        deployment = row["extra_info"]["tools_kwargs"]["env"]["deployment"]
        assert "/opt/miniconda3" in deployment["mounts"]
        assert row["extra_info"]["tools_kwargs"]["reward"]["metadata"]["env_prebuilt"] == "1"
    official_python.get_requirements_by_commit = lambda repo, commit: ""  # grading does not use the env script
    for patch in ("gold", "empty"):
        out = tmp_path / patch
        done = subprocess.run([*cli, "verify", "--data-path", str(env_rows), "--patch", patch, "--output-dir",
                               str(out), "--local-workers", "2"], capture_output=True, text=True, timeout=1800)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["resolved"] == (len(records) if patch == "gold" else 0), done.stderr[-3000:]
        results = pq.read_table(out / f"verify_{patch}.parquet").to_pylist()
        for row, record in zip(sorted(results, key=lambda r: r["instance_id"]), sorted(records, key=lambda r:
                                                                                         r["instance_id"])):
            verification = json.loads(row["verification"])
            ours = verification["report"][record["instance_id"]]
            prediction = {"instance_id": record["instance_id"], "model_name_or_path": "uni-agent",
                          "model_patch": record["patch"] if patch == "gold" else ""}
            theirs = get_eval_report(make_test_spec(record), prediction, str(out / verification["log_file"]),
                                     include_tests_status=True)[record["instance_id"]]
            assert theirs["tests_status"] == ours["tests_status"] and theirs["resolved"] == ours["resolved"]


@pytest.mark.skipif(bool(_mirrors_missing()), reason=_mirrors_missing() or "mirrors present")
def test_a_verification_gets_its_environments_on_first_use(tmp_path):
    """`uni-agent verify --build-envs`: rows straight from the preprocessor (no environment) get theirs before the
    grading starts (cached: after the test above, nothing is built again), gold resolves, and the rows file is left
    as it was."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [r for r in INSTANCES if r["instance_id"] == "psf__requests-1142"]
    rows = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(local_rows(records, tmp_path)), rows)
    before = rows.read_bytes()
    out = tmp_path / "gold"
    done = subprocess.run([sys.executable, "-m", "uni_agent.cli", "verify", "--data-path", str(rows), "--patch", "gold",
                           "--build-envs", "--git-mirror", str(MIRRORS), "--output-dir", str(out),
                           "--local-workers", "2"], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "build_envs: 1 rows need 1 environments" in done.stdout, done.stdout[-3000:]
    assert "psf__requests-1142: repository" in done.stdout
    assert json.loads((out / "summary.json").read_text())["resolved"] == 1
    assert rows.read_bytes() == before


def test_tests_that_cannot_import_what_the_answer_must_add_are_a_wrong_answer():
    """An empty answer to pylint-4551: the test module imports get_annotation, which the fix adds; nothing ran. That
    is the answer's fault (official: unresolved), not a broken environment; a missing third-party module still is."""
    from uni_agent.swebench.environment_failures import environment_failure
    from uni_agent.swebench.grading import SweGrade

    grade = SweGrade("pylint-dev__pylint-4551", True, {}, {"tests/x.py::test_a": "MISSING"}, {})
    own_code = ("ImportError while importing test module '/testbed/tests/x.py'.\nE   ImportError: cannot import name "
                "'get_annotation' from 'pylint.pyreverse.utils' (/testbed/pylint/pyreverse/utils.py)\n")
    assert environment_failure(own_code, grade, "", None) is None
    third_party = "E   ModuleNotFoundError: No module named 'astroid'\n"
    assert "No module named 'astroid'" in environment_failure(third_party, grade, "", None)
    assert environment_failure("collected 0 items\n", grade, "", None) == \
        "no FAIL_TO_PASS/PASS_TO_PASS test ran (the answer is empty)"


def test_prune_removes_what_no_build_asked_for_lately(tmp_path):
    """`uni-agent envs prune --older-than 30`: a repository and an environment unused for 40 days go, with an
    interpreter copy nothing uses and a half-built dir two days old; a fresh repository keeps the old environment it
    was prepared with, and a fresh environment keeps its interpreter."""
    import time

    from uni_agent.envs.build import prune_unused

    def made(path: Path, record: Path, content: dict, age_days: float) -> None:
        path.mkdir(parents=True)
        (path / "file").write_bytes(b"x" * 10000)
        record.write_text(json.dumps(content))
        when = time.time() - age_days * 86400
        os.utime(record, (when, when))

    envs, repos, pythons = tmp_path / "envs", tmp_path / "repos", tmp_path / "pythons"
    for name in ("py-used", "py-unused"):
        (pythons / name).mkdir(parents=True)
    made(envs / "old", envs / "old" / "env.json", {"mounts": {}}, 40)
    made(envs / "old-but-used", envs / "old-but-used" / "env.json", {"mounts": {}}, 40)
    made(envs / "fresh", envs / "fresh" / "env.json", {"mounts": {"/opt/py": str(pythons / "py-used")}}, 1)
    made(repos / "stale-1", repos / "stale-1.json", {"env": str(envs / "old")}, 40)
    made(repos / "fresh-1", repos / "fresh-1.json", {"env": str(envs / "old-but-used")}, 2)
    half = repos / ".half-1-abc"
    half.mkdir()
    os.utime(half, (time.time() - 2 * 86400,) * 2)

    pruned = prune_unused(30, tmp_path)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("*/*"))
    assert left == ["envs/fresh", "envs/old-but-used", "pythons/py-used", "repos/fresh-1", "repos/fresh-1.json"]
    assert (pruned.envs, pruned.repos) == (1, 1) and pruned.bytes >= 20000
    assert prune_unused(0, tmp_path).repos == 1 and not list(repos.iterdir())  # 0: everything
