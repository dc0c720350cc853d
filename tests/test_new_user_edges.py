"""What a new user meets first: bad numbers on the command line, a misspelled UNI_AGENT_* variable, the verify
command's outputs, what a failed run leaves behind, where the live page is, and the README's tour.

Each test gives the bad input and the exact message (or file, or line) it must produce. The runs use real Dask (the
session's LocalCluster, or one the CLI starts) and real bubblewrap sandboxes; no model is needed except a scripted
OpenAI-compatible server for the one real `run`."""

import copy
import json
import os
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from conftest import AGENT_CONFIG, REPO_ROOT
from uni_agent import AgentConfigs, run
from uni_agent.cli import build_parser, main
from uni_agent.config import ConfigError
from uni_agent import settings as settings_module
from uni_agent.settings import RunSettings, load_settings
from uni_agent.driver.verify import verify_all

KEEP = ("UNI_AGENT_SANDBOX_ROOT", "UNI_AGENT_CACHE_DIR")


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """No UNI_AGENT_* setting from the caller; an empty settings file (every field at its default)."""
    for key in list(os.environ):
        if key.upper().startswith("UNI_AGENT_") and key not in KEEP:
            monkeypatch.delenv(key)
    path = tmp_path / "settings.yaml"
    path.write_text("# empty\n")
    monkeypatch.setenv("UNI_AGENT_SETTINGS_FILE", str(path))
    return path


# -- 1. numeric flags: named by the flag (or variable, or file key) they came from, before anything starts ----------

@pytest.mark.parametrize(("argv", "message"), [
    (["--n", "0"], "--n must be >= 1 (got 0)"),
    (["--n", "-1"], "--n must be >= 1 (got -1)"),
    (["--max-turns", "0"], "--max-turns must be >= 1 (got 0)"),
    (["--agent-workers", "-1"], "--agent-workers must be >= 0 (got -1)"),  # 0: one per sandbox worker
    (["--num-workers", "-1"], "--num-workers must be >= 0 (got -1)"),  # the seed's spelling, named as typed
    (["--local-workers", "-1"], "--local-workers must be >= 0 (got -1)"),  # 0: one per 2 CPUs
    (["--n-workers", "-1"], "--n-workers must be >= 0 (got -1)"),
    (["--max-samples", "0"], "--max-samples must be -1 (every row) or >= 1 (got 0)"),
    (["--max-samples", "-2"], "--max-samples must be -1 (every row) or >= 1 (got -2)"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1 (got 0)"),
    (["--top-p", "1.5"], "--top-p must be <= 1 (got 1.5)"),
    (["--temperature", "-0.1"], "--temperature must be >= 0 (got -0.1)"),
    (["--tp", "0"], "--tp must be >= 1 (got 0)"),
])
def test_bad_number_flag_names_the_flag_and_starts_nothing(argv, message, clean_env, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", *argv, "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not out.exists()


def test_two_bad_flags_are_both_named(clean_env, capsys):
    assert main(["run", "--n", "0", "--max-turns", "0"]) == 2
    assert capsys.readouterr().err == ("error: invalid run settings:\n  --n must be >= 1 (got 0)\n"
                                       "  --max-turns must be >= 1 (got 0)\n")


def test_verify_flags_are_checked_too(clean_env, tmp_path, capsys):
    assert main(["verify", "--max-samples", "0", "--output-dir", str(tmp_path / "v")]) == 2
    assert capsys.readouterr().err == "error: --max-samples must be -1 (every row) or >= 1 (got 0)\n"


def test_bad_number_from_variable_file_or_keyword_names_that(clean_env, monkeypatch):
    monkeypatch.setenv("UNI_AGENT_AGENT_WORKERS", "-1")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == "UNI_AGENT_AGENT_WORKERS must be >= 0 (got '-1')"
    monkeypatch.delenv("UNI_AGENT_AGENT_WORKERS")

    clean_env.write_text("max_turns: 0\n")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == f"{clean_env}: max_turns must be >= 1 (got 0)"
    clean_env.write_text("# empty\n")

    with pytest.raises(ConfigError) as info:
        run([], n=0)  # the Python API: named as the keyword it was given as
    assert str(info.value) == "n must be >= 1 (got 0)"
    with pytest.raises(ConfigError) as info:
        load_settings(max_sample=3)
    assert str(info.value) == "max_sample: unknown setting (did you mean max_samples?)"


@pytest.mark.parametrize(("cpus", "given", "workers"), [(2, 0, 2), (4, 0, 2), (16, 0, 8), (64, 0, 16), (16, 3, 3)])
def test_local_workers_0_is_one_per_two_usable_cpus(clean_env, monkeypatch, cpus, given, workers):
    from uni_agent.driver.cluster import local_worker_count

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)))
    assert load_settings().local_workers == 0  # the default
    assert local_worker_count(load_settings(local_workers=given)) == workers


def test_secret_value_is_never_echoed_in_an_error(clean_env):
    with pytest.raises(ConfigError) as info:
        load_settings(api_key=12345678)
    assert "12345678" not in str(info.value) and str(info.value).startswith("api_key ")


# -- 2. settings typos ------------------------------------------------------------------------------------------------

def test_misspelled_variable_is_an_error_naming_the_closest(clean_env, monkeypatch, capsys):
    monkeypatch.setenv("UNI_AGENT_MAX_SAMPLE", "1")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == "unknown environment variable UNI_AGENT_MAX_SAMPLE (did you mean UNI_AGENT_MAX_SAMPLES?)"
    assert main(["run", "--n", "1"]) == 2
    assert capsys.readouterr().err == ("error: unknown environment variable UNI_AGENT_MAX_SAMPLE "
                                       "(did you mean UNI_AGENT_MAX_SAMPLES?)\n")


def test_variable_far_from_any_name_says_what_the_names_are(clean_env, monkeypatch):
    monkeypatch.setenv("UNI_AGENT_ZZZ", "1")
    with pytest.raises(ConfigError, match=re.escape(
            "unknown environment variable UNI_AGENT_ZZZ (run settings are UNI_AGENT_<key> for the keys "
            "`python -m uni_agent.settings_reference` lists)")):
        load_settings()


def test_every_uni_agent_variable_the_project_reads_is_known(clean_env):
    """The SLURM scripts export theirs into the driver's job: none of them may be taken for a typo. (settings.py,
    which names a typo in its docstring, is left out of the scan.)"""
    names = set()
    for folder in ("uni_agent", "cluster", "examples"):
        for path in (REPO_ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".sbatch", ".md", ".yaml") and path.name != "settings.py":
                names |= set(re.findall(r"\bUNI_AGENT_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    assert "UNI_AGENT_VENV" in names and "UNI_AGENT_SANDBOX_ROOT" in names  # the scan finds them
    settings_module.check_environment({name: "x" for name in names})  # raises on any unknown one
    settings = {f"UNI_AGENT_{f.upper()}" for f in RunSettings.model_fields}
    assert not settings_module.OTHER_VARIABLES & settings


# -- 3. verification: its own output dir per patch kind, where results went, each error's reason, its own flags -----

def test_verify_help_offers_only_flags_that_apply(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["verify", "--help"])
    text = capsys.readouterr().out
    for flag in ("--patch", "--output-dir", "--data-path", "--agent-config-path", "--max-samples", "--scheduler-file",
                 "--scheduler-address", "--n-workers", "outputs/verify-<patch>"):
        assert flag in text, flag
    for flag in ("--n ", "--temperature", "--no-verify", "--max-turns", "--num-workers", "--model", "--engine",
                 "--top-p", "--max-tokens", "--base-url", "--api-key", "--tp"):
        assert flag not in text, flag
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["verify", "--n", "2"])
    assert info.value.code == 2
    assert "unrecognized arguments: --n 2" in capsys.readouterr().err  # not taken for --n-workers 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--max-sample", "2"])  # no abbreviations: a typo is an error
    assert "unrecognized arguments: --max-sample 2" in capsys.readouterr().err


def _broken_test_patch(row):
    row = copy.deepcopy(row)
    row["extra_info"]["tools_kwargs"]["reward"]["metadata"]["test_patch"] = "this is not a patch\n"
    return row


def test_verify_default_dirs_per_patch_and_error_reasons(rows, dask_client, clean_env, tmp_path, monkeypatch,
                                                         capsys):
    monkeypatch.chdir(tmp_path)
    address = dask_client.scheduler.address
    data = [rows[0], _broken_test_patch(rows[1])]
    gold = verify_all(data, AGENT_CONFIG, patch="gold", scheduler_address=address)
    gold_dir = tmp_path / "outputs" / "verify-gold"
    err = capsys.readouterr().err
    assert (f"verify gold: 1 of 2 resolved; results in {gold_dir / 'verify_gold.parquet'}, summary in "
            f"{gold_dir / 'summary.json'}") in err
    summary = json.loads((gold_dir / "summary.json").read_text())
    assert summary == gold.summary
    assert summary["output_dir"] == str(gold_dir) and summary["results"] == str(gold_dir / "verify_gold.parquet")
    assert summary["resolved_ids"] == [rows[0]["instance_id"]]
    assert summary["timeout_or_error_ids"] == [rows[1]["instance_id"]]
    assert list(summary["errors"]) == [rows[1]["instance_id"]]
    assert summary["errors"][rows[1]["instance_id"]].startswith("error: RuntimeError: the test patch did not apply")

    verify_all(rows[:1], AGENT_CONFIG, patch="empty", scheduler_address=address)
    empty_dir = tmp_path / "outputs" / "verify-empty"
    assert json.loads((empty_dir / "summary.json").read_text())["patch"] == "empty"
    assert json.loads((gold_dir / "summary.json").read_text()) == summary  # the gold check is still there
    assert not (tmp_path / "outputs" / "run").exists()


def test_verify_rejects_an_unknown_patch_kind(clean_env):
    with pytest.raises(ConfigError, match=re.escape("patch='golden': choose one of gold, empty, oracle")):
        verify_all([], patch="golden")


def test_long_error_reason_is_cut_with_an_ellipsis():
    from uni_agent.driver.verify import MAX_REASON_CHARS, _reasons

    results = pd.DataFrame([{"instance_id": "a", "bucket": "timeout_or_error", "status": "error", "error": "x" * 900},
                            {"instance_id": "b", "bucket": "timeout_or_error", "status": "timeout", "error": None},
                            {"instance_id": "c", "bucket": "wrong_answer", "status": "unresolved", "error": None}])
    reasons = _reasons(results)
    assert reasons["b"] == "timeout" and "c" not in reasons
    assert len(reasons["a"]) == MAX_REASON_CHARS and reasons["a"].endswith("x…")


# -- 4. leftovers and the page line -----------------------------------------------------------------------------------

def test_run_that_fails_validation_leaves_nothing(clean_env, rows, tmp_path):
    out = tmp_path / "out"
    bad = copy.deepcopy(rows[0])
    bad["agent_name"] = "no_such_agent"
    with pytest.raises(ConfigError, match=r"no valid rows to run \(1 rejected\)"):
        run([bad], AGENT_CONFIG, output_dir=str(out), engine="external", base_url="http://127.0.0.1:9/v1",
            model_name="m", progress=False)
    assert not out.exists()  # neither logs/ nor run.json
    with pytest.raises(ConfigError):
        run(rows[:1], tmp_path / "missing.yaml", output_dir=str(out), progress=False)
    assert not out.exists()


def test_run_with_a_client_prints_the_page(clean_env, rows, dask_client, tmp_path, capfd):
    from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

    agents = AgentConfigs.load(AGENT_CONFIG).override_all(
        {"interaction": {"tools_in": "api", "constrain_tool_calls": False}})
    with ScriptedLLM(lambda body: tool_call_message("submit", {})) as server:
        outcome = run(rows[:1], agents, client=dask_client, engine="external", base_url=server.base_url,
                      model_name="scripted", output_dir=str(tmp_path / "out"), progress=False, verify=False)
    assert outcome.summary["num_rollouts"] == 1
    err = capfd.readouterr().err
    assert f"uni-agent page: {dask_client.dashboard_link.rsplit('/', 1)[0]}/uni-agent?token=" in err, err[-2000:]
    assert (tmp_path / "out" / "run.json").exists() and (tmp_path / "out" / "logs").is_dir()


def test_scheduler_file_prints_the_page(clean_env, dask_client, tmp_path, capfd):
    import asyncio

    from uni_agent.driver.cluster import cluster_client

    scheduler_file = tmp_path / "scheduler.json"  # what `dask scheduler --scheduler-file` writes: its identity
    info = dask_client.scheduler_info()
    scheduler_file.write_text(json.dumps({k: info[k] for k in ("type", "id", "address", "services")}))
    settings = load_settings(scheduler_file=str(scheduler_file), worker_wait_timeout=30)

    async def connect():
        async with cluster_client(settings) as client:
            return client.dashboard_link

    link = asyncio.run(connect())
    assert link and f"uni-agent page: {link.rsplit('/', 1)[0]}/uni-agent?token=" in capfd.readouterr().err


# -- the README's tour: its first command is sized to finish in minutes, and says how long it took -----------------

def test_tour_first_command_is_small_and_says_how_long():
    readme = (REPO_ROOT / "README.md").read_text()
    tour = readme[readme.index("## A five-minute tour"):]
    block = tour[tour.index("```bash") + len("```bash"):]
    command = block[: block.index("```")].replace("\\\n", " ")
    argv = shlex.split(command)
    assert argv[0].endswith("python") and argv[1].endswith("parallel_infer.py"), argv
    args = build_parser().parse_args(["run", *argv[2:]])
    assert args.data_path is None or Path(REPO_ROOT / args.data_path).exists(), "the tour's data must exist"
    assert 1 <= args.max_samples * (args.n or 1) <= 6, "the first command runs a handful of rollouts"
    after = tour[tour.index("```", tour.index("```bash") + 3) + 3:][:600]
    assert re.search(r"took\s+(about\s+)?\d+(\s+to\s+\d+)?\s+(s|seconds|minutes?)", after), \
        "the tour says how long its command took"


# -- Terminal-Bench preprocessing: a skip reason cut short says so -----------------------------------------------------

def test_terminal_bench_skip_reason_marks_the_cut(tmp_path, capsys):
    from argparse import Namespace

    from uni_agent.terminal_bench.preprocess import run_cli

    args = Namespace(tasks_dir=None, local_save_dir=str(tmp_path), deployment="local", agent_name="swe_agent",
                     build_images=False, build_arg=[], build_network=None, max_tasks=None)
    assert run_cli(args) == 0
    skipped = [line for line in capsys.readouterr().err.splitlines() if "use-installed-tool" in line]
    run_line = "mkdir -p /opt/rot && printf '#!/bin/sh\\ntr \"A-Za-z\" \"N-ZA-Mn-za-m\"\\n' > /opt/rot/rot13"
    assert skipped == [f"skipped task use-installed-tool: needs its image, the host cannot stand in for it "
                       f"(environment/Dockerfile line 3: RUN {run_line[:59]}…); use --deployment podman, or local "
                       f"with --local-images"], skipped
