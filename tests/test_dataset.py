"""Bundled tasks → Parquet rows (the seed schema) → rollout specs, and how bad files and bad rows are reported."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from uni_agent.config import AgentConfigs, ConfigError
from uni_agent.driver.dataset import build_specs, read_rows
from uni_agent.settings import REPO_ROOT
from uni_agent.tasks.swe_form import BUNDLED_DIR, convert

EXAMPLE_CONFIG = REPO_ROOT / "examples" / "agent_interaction" / "agent_config_local.yaml"
BUNDLED_IDS = sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "instance.json").exists())


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNI_AGENT_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("UNI_AGENT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def parquet(tmp_path: Path) -> Path:
    out = tmp_path / "data" / "bundled.parquet"
    assert convert(None, out) == len(BUNDLED_IDS)
    return out


@pytest.fixture
def agents() -> AgentConfigs:
    return AgentConfigs.load(EXAMPLE_CONFIG)


def test_bundled_tasks_exist() -> None:
    assert len(BUNDLED_IDS) >= 2


def test_convert_writes_one_seed_row_per_bundled_task(parquet: Path) -> None:
    table = pq.read_table(parquet)
    assert table.num_rows == len(BUNDLED_IDS)
    assert {"prompt", "agent_name", "extra_info", "data_source", "instance_id"} <= set(table.column_names)
    rows = read_rows(parquet)
    assert sorted(r["instance_id"] for r in rows) == BUNDLED_IDS
    for row in rows:
        task_id = row["instance_id"]
        instance = json.loads((BUNDLED_DIR / task_id / "instance.json").read_text())
        assert row["agent_name"] == "swe_agent"
        assert row["data_source"] == "uni-agent/bundled"
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert instance["problem_statement"].strip() in row["prompt"][1]["content"]
        assert "/testbed" in row["prompt"][1]["content"]
        extra = row["extra_info"]
        assert extra["instance_id"] == task_id
        env = extra["tools_kwargs"]["env"]
        assert env["deployment"] == {"type": "local", "repo": f"bundled:{task_id}", "workdir": "/testbed"}
        reward = extra["tools_kwargs"]["reward"]
        assert reward["name"] == "swe_local"
        meta = reward["metadata"]
        assert meta["instance_id"] == task_id
        assert meta["patch"] == instance["patch"]
        assert meta["test_patch"] == instance["test_patch"]
        assert json.loads(meta["FAIL_TO_PASS"]) == list(instance["FAIL_TO_PASS"])
        assert json.loads(meta["PASS_TO_PASS"]) == list(instance["PASS_TO_PASS"])


def test_convert_user_tasks_dir_refers_to_its_repo(tmp_path: Path) -> None:
    source = BUNDLED_DIR / BUNDLED_IDS[0]
    tasks = tmp_path / "mytasks"
    task = tasks / "my-task"
    (task / "repo").mkdir(parents=True)
    (task / "instance.json").write_text((source / "instance.json").read_text())
    out = tmp_path / "mine.parquet"
    assert convert(tasks, out, agent_name="other") == 1
    [row] = read_rows(out)
    assert row["agent_name"] == "other"
    assert row["data_source"] == "uni-agent/local"
    assert row["extra_info"]["tools_kwargs"]["env"]["deployment"]["repo"] == str((task / "repo").resolve())


def test_convert_reports_bad_task_dirs(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no task directories"):
        convert(empty, tmp_path / "out.parquet")
    no_repo = tmp_path / "norepo" / "t1"
    no_repo.mkdir(parents=True)
    (no_repo / "instance.json").write_text((BUNDLED_DIR / BUNDLED_IDS[0] / "instance.json").read_text())
    with pytest.raises(ConfigError, match="no repo/ directory"):
        convert(no_repo.parent, tmp_path / "out.parquet")
    (no_repo / "repo").mkdir()
    (no_repo / "instance.json").write_text(json.dumps({"instance_id": "t1", "patch": ""}))
    with pytest.raises(ConfigError) as info:
        convert(no_repo.parent, tmp_path / "out.parquet")
    assert str(no_repo / "instance.json") in str(info.value)
    # test_patch may be absent (no test changes: the tests live in repo/); the test lists may not.
    assert "FAIL_TO_PASS" in str(info.value) and "test_patch" not in str(info.value)


def test_build_specs_from_converted_rows(parquet: Path, agents: AgentConfigs) -> None:
    rows = read_rows(parquet)
    specs, problems = build_specs(rows, agents, "run", n=2, source=str(parquet))
    assert problems == []
    assert len(specs) == 2 * len(rows)
    by_id: dict[str, list[Any]] = {}
    for spec in specs:
        by_id.setdefault(spec.instance_id, []).append(spec)
    assert sorted(by_id) == BUNDLED_IDS
    for index, row in enumerate(rows):
        pair = by_id[row["instance_id"]]
        assert [s.rollout for s in pair] == [0, 1]
        assert {s.key for s in pair} == {(row["instance_id"], 0), (row["instance_id"], 1)}
        for spec in pair:
            assert spec.run_id == "run"
            assert spec.row_index == index
            assert spec.data_source == "uni-agent/bundled"
            assert spec.prompt == [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
            agent = spec.agent
            assert agent.name == "swe_agent"
            # The row's deployment merged over the YAML's.
            assert agent.env.deployment.repo == f"bundled:{row['instance_id']}"
            assert agent.env.deployment.workdir == "/testbed"
            assert agent.env.deployment.startup_timeout == 60  # from the YAML
            assert agent.env.env_variables["PAGER"] == "cat"  # from the YAML
            assert agent.interaction.max_turns == 6
            assert agent.reward.name == "swe_local"
            assert agent.reward.eval_timeout == 300
            assert agent.reward.metadata["test_patch"] == row["extra_info"]["tools_kwargs"]["reward"]["metadata"][
                "test_patch"]


def test_build_specs_accepts_json_string_fields(parquet: Path, agents: AgentConfigs) -> None:
    row = read_rows(parquet)[0]
    as_strings = dict(row, prompt=json.dumps(row["prompt"]), extra_info=json.dumps(row["extra_info"]))
    specs, problems = build_specs([as_strings], agents, "run", n=1)
    assert problems == []
    [spec] = specs
    assert spec.agent.env.deployment.repo == f"bundled:{row['instance_id']}"
    assert spec.prompt[1]["content"] == row["prompt"][1]["content"]


# -- read_rows errors ----------------------------------------------------------------------------------------------


def test_read_rows_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.parquet"
    with pytest.raises(ConfigError) as info:
        read_rows(path)
    assert str(path) in str(info.value)
    assert "not found" in str(info.value)


def test_read_rows_truncated_file(parquet: Path, tmp_path: Path) -> None:
    data = parquet.read_bytes()
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError) as info:
        read_rows(truncated)
    assert str(truncated) in str(info.value)
    assert "not a readable Parquet file" in str(info.value)


def test_read_rows_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    path.write_text("instance_id,prompt\nx,y\n")
    with pytest.raises(ConfigError) as info:
        read_rows(path)
    assert str(path) in str(info.value)


def test_read_rows_missing_column(parquet: Path, tmp_path: Path) -> None:
    table = pq.read_table(parquet).drop_columns(["extra_info"])
    path = tmp_path / "no_extra_info.parquet"
    pq.write_table(table, path)
    with pytest.raises(ConfigError) as info:
        read_rows(path)
    message = str(info.value)
    assert str(path) in message
    assert "missing columns ['extra_info']" in message
    assert "agent_name" in message  # the columns it did find


# -- bad rows ------------------------------------------------------------------------------------------------------


def test_build_specs_reports_bad_rows_and_keeps_the_good_ones(parquet: Path, agents: AgentConfigs) -> None:
    good = read_rows(parquet)[:3]
    template = good[0]

    def variant(instance_id: str) -> dict[str, Any]:
        row = copy.deepcopy(template)
        row["instance_id"] = instance_id
        row["extra_info"]["instance_id"] = instance_id
        return row

    unknown_agent = variant("bad-agent")
    unknown_agent["agent_name"] = "ghost_agent"
    bad_prompt = variant("bad-prompt")
    bad_prompt["prompt"] = ["fix the bug please"]
    dict_prompt = variant("dict-prompt")
    dict_prompt["prompt"] = {"role": "user", "content": "hi"}
    no_test_patch = variant("no-test-patch")
    del no_test_patch["extra_info"]["tools_kwargs"]["reward"]["metadata"]["test_patch"]
    null_test_patch = variant("null-test-patch")  # how an absent key reads back from a Parquet struct
    null_test_patch["extra_info"]["tools_kwargs"]["reward"]["metadata"]["test_patch"] = None
    unknown_reward = variant("bad-reward")
    unknown_reward["extra_info"]["tools_kwargs"]["reward"]["name"] = "swe_remote"
    bad_field = variant("bad-field")
    bad_field["extra_info"]["tools_kwargs"]["interaction"] = {"max_turn": 3}
    duplicate = copy.deepcopy(good[1])

    rows = [good[0], unknown_agent, bad_prompt, good[1], dict_prompt, no_test_patch, null_test_patch,
            unknown_reward, bad_field, duplicate, good[2]]
    specs, problems = build_specs(rows, agents, "run", n=2, source="data.parquet")

    expected = {
        1: ("bad-agent", ["unknown agent_name 'ghost_agent'", "swe_agent"]),
        2: ("bad-prompt", ["prompt must be a list of chat messages"]),
        4: ("dict-prompt", ["prompt must be a list of chat messages"]),
        5: ("no-test-patch", ["reward.metadata lacks 'test_patch'"]),
        6: ("null-test-patch", ["reward.metadata lacks 'test_patch'"]),
        7: ("bad-reward", ["'swe_remote'", "not a known grader", "swe_local"]),
        8: ("bad-field", ["interaction.max_turn:"]),
        9: (good[1]["instance_id"], ["duplicate instance_id"]),
    }
    assert [p.row_index for p in problems] == sorted(expected)
    for problem in problems:
        instance_id, parts = expected[problem.row_index]
        assert problem.instance_id == instance_id
        assert problem.error.startswith(f"data.parquet row {problem.row_index} (instance_id={instance_id})"), \
            problem.error
        for part in parts:
            assert part in problem.error, (part, problem.error)

    # The good rows (and the first of the duplicated ids) still produce their specs, in row order.
    assert [(s.instance_id, s.rollout, s.row_index) for s in specs] == [
        (good[0]["instance_id"], 0, 0), (good[0]["instance_id"], 1, 0),
        (good[1]["instance_id"], 0, 3), (good[1]["instance_id"], 1, 3),
        (good[2]["instance_id"], 0, 10), (good[2]["instance_id"], 1, 10),
    ]


def test_build_specs_without_instance_id_uses_extra_info_then_row_index(parquet: Path, agents: AgentConfigs) -> None:
    row = read_rows(parquet)[0]
    from_extra = dict(row, instance_id=None)
    neither = copy.deepcopy(from_extra)
    neither["extra_info"]["instance_id"] = None
    neither["agent_name"] = "ghost_agent"
    specs, problems = build_specs([from_extra, neither], agents, "r", n=1)
    assert [s.instance_id for s in specs] == [row["instance_id"]]
    assert [(p.row_index, p.instance_id) for p in problems] == [(1, "row-1")]


def test_build_specs_rejects_model_in_tools_kwargs(parquet: Path, agents: AgentConfigs) -> None:
    row = copy.deepcopy(read_rows(parquet)[0])
    row["extra_info"]["tools_kwargs"]["model"] = "some-model"
    specs, problems = build_specs([row], agents, "r", n=1)
    assert specs == []
    assert len(problems) == 1 and "tools_kwargs.model" in problems[0].error


def test_build_specs_rows_written_and_read_back(tmp_path: Path, parquet: Path, agents: AgentConfigs) -> None:
    """Bad rows survive a Parquet round trip as bad rows (struct columns fill absent keys with nulls)."""
    rows = read_rows(parquet)[:2]
    bad = copy.deepcopy(rows[1])
    bad["instance_id"] = "bad-reward"
    bad["extra_info"]["tools_kwargs"]["reward"]["name"] = "nope"
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(rows + [bad]), path)
    specs, problems = build_specs(read_rows(path), agents, "r", n=1, source=str(path))
    assert [s.instance_id for s in specs] == [rows[0]["instance_id"], rows[1]["instance_id"]]
    assert [(p.row_index, p.instance_id) for p in problems] == [(2, "bad-reward")]
    assert str(path) in problems[0].error


def test_plain_string_prompt_is_reported_with_its_row(parquet: Path, agents: AgentConfigs) -> None:
    row = dict(read_rows(parquet)[0], prompt="fix the bug")
    specs, problems = build_specs([row], agents, "run", n=1, source="data.parquet")
    assert specs == [] and len(problems) == 1
    assert "data.parquet row 0" in problems[0].error and "prompt" in problems[0].error


def test_rows_that_share_one_agent_config_have_its_reward_checked_once(parquet: Path, agents: AgentConfigs,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows without tools_kwargs share the agent's one validated config: its reward is checked once for all of them
    (at 100,000 rollouts the per-row check was a fifth of loading them). A shared config that fails the check still
    fails every row that uses it, each named by its own index."""
    import uni_agent.driver.dataset as dataset

    rows = read_rows(parquet)[:3]
    reward = rows[0]["extra_info"]["tools_kwargs"]["reward"]
    for row in rows:
        row["extra_info"]["tools_kwargs"] = {}
    checked: list[str] = []
    real_check = dataset.check_reward_config

    def counted(agent: Any, where: str) -> None:
        checked.append(where)
        real_check(agent, where)

    monkeypatch.setattr(dataset, "check_reward_config", counted)
    specs, problems = build_specs(rows, agents, "r", n=2)  # the example config names no grader of its own
    assert [p.row_index for p in problems] == [0, 1, 2] and not specs
    assert all(p.error.startswith(f"rows row {p.row_index} ") and "not a known grader" in p.error
               for p in problems), problems
    assert len(checked) == 3

    checked.clear()
    specs, problems = build_specs(rows, agents.override_all({"reward": reward}), "r", n=2)
    assert not problems and len(specs) == 6
    assert len({id(s.agent) for s in specs}) == 1 and checked == [f"rows row 0 (instance_id={rows[0]['instance_id']})"]


def test_configs_jsonl_holds_each_rows_config_as_its_own_json_line(tmp_path: Path, parquet: Path,
                                                                   agents: AgentConfigs) -> None:
    """configs.jsonl: one line per row, `json.dumps({"instance_id", "agent"}, sort_keys=True)` byte for byte (its
    sha256 tells a resumed session whether the configs changed), whether rows share the agent's one config (no
    tools_kwargs: dumped once) or each has its own."""
    from uni_agent.driver.manifest import _write_configs

    rows = read_rows(parquet)[:4]
    reward = rows[0]["extra_info"]["tools_kwargs"]["reward"]
    for row in rows[2:]:
        row["extra_info"]["tools_kwargs"] = {}
    specs, problems = build_specs(rows, agents.override_all({"reward": reward}), "r", n=2)
    assert not problems and len({id(s.agent) for s in specs}) == 3  # two own configs, one shared by two rows

    written = _write_configs(tmp_path, specs, session=1)
    text = (tmp_path / "configs.jsonl").read_text()
    expected = "".join(json.dumps({"instance_id": s.instance_id,
                                   "agent": s.agent.model_dump(mode="json", by_alias=True)}, sort_keys=True) + "\n"
                       for s in specs[::2])
    assert text == expected
    assert written["count"] == 4 and [json.loads(line)["instance_id"] for line in text.splitlines()] == [
        r["instance_id"] for r in rows]
