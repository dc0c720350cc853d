"""Agent config YAML and row merging: what is accepted, what wins, and what the errors say (run settings:
tests/test_run_settings.py)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from uni_agent.config import TOOL_NAMES, AgentConfigs, ConfigError, deep_merge
from uni_agent.driver.inputs import AGENT_SETTINGS, load_inputs
from uni_agent.settings import REPO_ROOT, RunSettings

EXAMPLE_CONFIG = REPO_ROOT / "examples" / "agent_interaction" / "agent_config_local.yaml"


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNI_AGENT_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("UNI_AGENT_CACHE_DIR", str(tmp_path / "cache"))


def example_entries() -> list[dict[str, Any]]:
    return yaml.safe_load(EXAMPLE_CONFIG.read_text())


def write_agents(tmp_path: Path, entries: Any, name: str = "agents.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(entries))
    return path


def names_field(message: str, field: str) -> bool:
    """`field` (dotted) appears as an error line's field. A discriminated union (env.deployment) puts its tag
    (`local`) into the path; either spelling counts."""
    pattern = re.escape(field).replace(r"env\.deployment\.", r"env\.deployment\.(?:local\.)?")
    return re.search(rf"^  {pattern}: ", message, re.MULTILINE) is not None


def load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        AgentConfigs.load(path)
    return str(info.value)


# -- AgentConfigs.load ---------------------------------------------------------------------------------------------


def test_shipped_local_config_loads_with_its_values() -> None:
    agents = AgentConfigs.load(EXAMPLE_CONFIG)
    assert agents.names() == ["swe_agent"]
    assert agents.source == str(EXAMPLE_CONFIG)
    agent = agents.validated["swe_agent"]
    assert agent.name == "swe_agent"
    assert agent.target == "uni_agent.agent_loop.UniAgentLoop"
    assert agent.concurrency == 8
    assert agent.log_dir is None
    assert agent.interaction.max_turns == 6
    assert agent.interaction.action_timeout == 30
    assert agent.interaction.timeout_budget == 3
    assert agent.interaction.episode_timeout == 600
    assert agent.interaction.tools_in == "prompt"
    assert agent.interaction.tool_call_parser == "hermes"
    deployment = agent.env.deployment
    assert deployment.type == "local"
    assert deployment.repo is None
    assert deployment.startup_timeout == 60
    assert deployment.workspace == "auto"
    assert deployment.network is False
    assert agent.env.env_variables["PAGER"] == "cat"
    assert agent.env.env_variables["TQDM_DISABLE"] == "1"
    assert [t.name for t in agent.tools] == list(TOOL_NAMES)
    assert agent.reward.eval_timeout == 300
    assert agent.reward.name is None


@pytest.mark.parametrize("target", ["uni_agent.agent_loop.UniAgentLoop", "uni_agent.episode.agent_loop.UniAgentLoop",
                                    None])
def test_the_seeds_loop_path_the_packaged_one_and_none_name_the_same_loop(target: str | None) -> None:
    """The seed's `_target_` (in users' YAML files) keeps working after the loop moved into uni_agent.episode, and an
    agent that names none runs the same loop (config names no loop: the episode knows its own)."""
    from uni_agent.agent_loop import UniAgentLoop as seed_loop
    from uni_agent.episode.agent_loop import UniAgentLoop, strategy_for

    entry = {"name": "a"} if target is None else {"name": "a", "_target_": target}
    agent = AgentConfigs({"a": entry}, "test").validated["a"]
    assert agent.target == target
    assert type(strategy_for(agent)) is UniAgentLoop and seed_loop is UniAgentLoop


def test_single_mapping_is_one_agent(tmp_path: Path) -> None:
    path = write_agents(tmp_path, {"name": "solo", "interaction": {"max_turns": 2}})
    agents = AgentConfigs.load(path)
    assert agents.names() == ["solo"]
    assert agents.validated["solo"].interaction.max_turns == 2
    # Defaults fill what the file leaves out.
    assert agents.validated["solo"].interaction.action_timeout == 60


@pytest.mark.parametrize(
    ("mutate", "field", "detail"),
    [
        (lambda a: a["interaction"].__setitem__("max_turn", 3), "interaction.max_turn", "Extra inputs"),
        (lambda a: a["interaction"].__setitem__("max_turns", "many"), "interaction.max_turns", "valid integer"),
        (lambda a: a["tools"].append({"name": "rm_rf"}), "tools.3.name", "unknown tool 'rm_rf'"),
        (lambda a: a["env"]["deployment"].__setitem__("type", "kubernetes"), "env.deployment", "'kubernetes'"),
        (lambda a: a.__setitem__("_target_", "no_such_pkg_xyz.Loop"), "_target_", "cannot import"),
        (lambda a: a.__setitem__("_target_", "uni_agent.episode.agent_loop.NoSuchLoop"), "_target_", "NoSuchLoop"),
        (lambda a: a["env"]["deployment"].__setitem__("workspace", "tmpfs"), "env.deployment.workspace",
         "'auto', 'overlay' or 'copy'"),
        (lambda a: a["interaction"].__setitem__("max_turns", 0), "interaction.max_turns", "greater than"),
    ],
    ids=["unknown-key", "wrong-type", "unknown-tool", "unknown-deployment", "unimportable-module",
         "unimportable-attr", "bad-workspace", "max-turns-zero"],
)
def test_invalid_agent_entry_names_file_and_field(tmp_path: Path, mutate: Any, field: str, detail: str) -> None:
    entries = example_entries()
    mutate(entries[0])
    path = write_agents(tmp_path, entries)
    message = load_error(path)
    assert str(path) in message
    assert "swe_agent" in message
    assert names_field(message, field), message
    assert detail in message


def test_unknown_tool_error_lists_available_tools(tmp_path: Path) -> None:
    entries = example_entries()
    entries[0]["tools"] = [{"name": "browser"}]
    message = load_error(write_agents(tmp_path, entries))
    for name in TOOL_NAMES:
        assert name in message


def test_invalid_yaml_names_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("- name: x\n  interaction: [\n")
    message = load_error(path)
    assert str(path) in message
    assert "invalid YAML" in message
    assert "line" in message  # where in the file the parser stopped


def test_missing_file_names_file(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "agents.yaml"
    message = load_error(path)
    assert str(path) in message
    assert "not found" in message


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        ("[]\n", "expected a list of agents"),
        ("just a string\n", "expected a list of agents"),
        ("- name: a\n- interaction: {}\n", "agent #1"),
        ("- name: 7\n", "agent #0"),
        ("- name: a\n- name: a\n", "'a' appears twice"),
    ],
    ids=["empty-list", "scalar", "no-name", "non-string-name", "duplicate-name"],
)
def test_malformed_agent_list(tmp_path: Path, content: str, detail: str) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(content)
    message = load_error(path)
    assert str(path) in message
    assert detail in message


# -- deep_merge ----------------------------------------------------------------------------------------------------


def test_deep_merge_nested_dicts_lists_scalars_and_inputs_unchanged() -> None:
    base = {
        "a": {"b": 1, "c": {"d": 2, "e": [1, 2]}, "keep": "x"},
        "lst": [1, 2, 3],
        "scalar": 1,
        "dict_to_scalar": {"x": 1},
        "scalar_to_dict": 5,
    }
    override = {
        "a": {"c": {"d": 20, "new": True}, "b": None},
        "lst": [9],
        "scalar": "two",
        "dict_to_scalar": 0,
        "scalar_to_dict": {"y": 2},
        "added": {"z": [1]},
    }
    base_before, override_before = copy.deepcopy(base), copy.deepcopy(override)
    merged = deep_merge(base, override)
    assert merged == {
        "a": {"b": None, "c": {"d": 20, "e": [1, 2], "new": True}, "keep": "x"},
        "lst": [9],
        "scalar": "two",
        "dict_to_scalar": 0,
        "scalar_to_dict": {"y": 2},
        "added": {"z": [1]},
    }
    assert base == base_before
    assert override == override_before
    # The result shares no mutable parts with either input.
    merged["a"]["c"]["e"].append(3)
    merged["added"]["z"].append(2)
    merged["lst"].append(10)
    assert base == base_before
    assert override == override_before


# -- AgentConfigs.for_row ------------------------------------------------------------------------------------------


def test_for_row_row_values_win_and_the_rest_is_kept() -> None:
    agents = AgentConfigs.load(EXAMPLE_CONFIG)
    raw_before = copy.deepcopy(agents.raw)
    agent = agents.for_row(
        "swe_agent",
        {"env": {"deployment": {"repo": "/data/task-1"}}, "interaction": {"max_turns": 11},
         "reward": {"name": "swe_local", "metadata": {"test_patch": "x"}}},
        "rows row 0 (instance_id=t1)",
    )
    assert agent.env.deployment.repo == "/data/task-1"
    assert agent.interaction.max_turns == 11
    assert agent.reward.name == "swe_local"
    assert agent.reward.metadata == {"test_patch": "x"}
    # Everything else comes from the YAML entry.
    assert agent.env.deployment.startup_timeout == 60
    assert agent.interaction.action_timeout == 30
    assert agent.interaction.tools_in == "prompt"
    assert agent.env.env_variables["PAGER"] == "cat"
    assert agent.reward.eval_timeout == 300
    # The loaded agents are not changed by a row.
    assert agents.raw == raw_before
    assert agents.validated["swe_agent"].interaction.max_turns == 6
    assert agents.validated["swe_agent"].env.deployment.repo is None


def test_for_row_without_tools_kwargs_is_the_agent_itself() -> None:
    agents = AgentConfigs.load(EXAMPLE_CONFIG)
    assert agents.for_row("swe_agent", None, "row 0") == agents.validated["swe_agent"]
    assert agents.for_row("swe_agent", {}, "row 0") == agents.validated["swe_agent"]


def test_for_row_unknown_agent_names_row_and_known_agents(tmp_path: Path) -> None:
    path = write_agents(tmp_path, [{"name": "alpha"}, {"name": "beta"}])
    agents = AgentConfigs.load(path)
    where = "data.parquet row 4 (instance_id=abc)"
    with pytest.raises(ConfigError) as info:
        agents.for_row("gamma", {"interaction": {"max_turns": 2}}, where)
    message = str(info.value)
    assert message.startswith(where)
    assert "'gamma'" in message
    assert "alpha" in message and "beta" in message
    assert str(path) in message


@pytest.mark.parametrize(
    ("tools_kwargs", "field"),
    [
        ({"interaction": {"max_turn": 3}}, "interaction.max_turn"),
        ({"env": {"deployment": {"repoo": "/x"}}}, "env.deployment.repoo"),
        ({"env": {"deployment": {"network": "sometimes"}}}, "env.deployment.network"),
        ({"reward": {"eval_timeout": "soon"}}, "reward.eval_timeout"),
    ],
)
def test_for_row_bad_key_names_row_and_field(tools_kwargs: dict[str, Any], field: str) -> None:
    agents = AgentConfigs.load(EXAMPLE_CONFIG)
    where = "rows row 7 (instance_id=bad-row)"
    with pytest.raises(ConfigError) as info:
        agents.for_row("swe_agent", tools_kwargs, where)
    message = str(info.value)
    assert message.startswith(where)
    assert names_field(message, field), message


def test_for_row_rejects_model() -> None:
    agents = AgentConfigs.load(EXAMPLE_CONFIG)
    where = "rows row 2 (instance_id=m)"
    with pytest.raises(ConfigError) as info:
        agents.for_row("swe_agent", {"model": "gpt-x"}, where)
    message = str(info.value)
    assert message.startswith(where)
    assert "tools_kwargs.model" in message


def test_override_all_applies_to_every_agent(tmp_path: Path) -> None:
    agents = AgentConfigs.load(write_agents(tmp_path, [{"name": "a"}, {"name": "b", "interaction": {"max_turns": 4}}]))
    overridden = agents.override_all({"interaction": {"max_turns": 9}})
    assert {n: a.interaction.max_turns for n, a in overridden.validated.items()} == {"a": 9, "b": 9}
    assert agents.validated["b"].interaction.max_turns == 4


@pytest.mark.parametrize("name", sorted(AGENT_SETTINGS))
def test_a_run_setting_beats_the_row_which_beats_the_yaml(name: str, tmp_path: Path, rows) -> None:
    """For every run setting that reaches an agent: YAML entry < row's tools_kwargs < the setting, when set."""
    section, key = AGENT_SETTINGS[name]
    yaml_value, row_value, run_value = 6, 4, 9

    def value(setting: Any, row_sets: bool) -> Any:
        row = copy.deepcopy(rows[0])
        if row_sets:
            row["extra_info"]["tools_kwargs"].setdefault(section, {})[key] = row_value
        agents = AgentConfigs.load(write_agents(tmp_path, [{"name": row["agent_name"], section: {key: yaml_value}}]))
        settings = RunSettings.model_construct(**{**RunSettings().model_dump(), name: setting, "max_samples": -1})
        inputs = load_inputs([row], agents, settings, tmp_path, run_id="r", n=1, purpose="run")
        return getattr(getattr(inputs.specs[0].agent, section), key)

    assert value(None, row_sets=False) == yaml_value
    assert value(None, row_sets=True) == row_value
    assert value(run_value, row_sets=True) == run_value
    assert value(run_value, row_sets=False) == run_value


def test_an_old_spelling_of_a_key_is_an_unknown_key(tmp_path: Path) -> None:
    """No old key names are kept alive (a 0.1.0 project had no users of them): `tool_parser`, the old name of
    `tool_call_parser`, is refused like any misspelling, naming the file, the agent and the field."""
    message = load_error(write_agents(tmp_path, [{"name": "a", "interaction": {"tool_parser": "qwen3_coder"}}]))
    assert message.startswith(f"{tmp_path / 'agents.yaml'} (agent 'a'): invalid agent config"), message
    assert names_field(message, "interaction.tool_parser") and "Extra inputs are not permitted" in message, message
    with pytest.raises(ConfigError, match=r"row 3: invalid agent config\n  interaction.tool_parser: Extra inputs"):
        AgentConfigs.load(EXAMPLE_CONFIG).for_row("swe_agent", {"interaction": {"tool_parser": "hermes"}}, "row 3")


def test_constrained_tool_calls_need_prompt_tools(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text("- name: a\n  interaction: {tools_in: api, constrain_tool_calls: true}\n")
    with pytest.raises(ConfigError, match="constrain_tool_calls needs tools_in: prompt"):
        AgentConfigs.load(path)


def test_constrained_tool_calls_need_a_format_a_json_schema_can_constrain(tmp_path: Path) -> None:
    """The decoding constraint is the chosen format's own schema; a tag format (qwen3_coder) has none, so asking to
    constrain it is an error at load time (it used to send hermes's JSON shape, which the qwen3_coder parser rejects)."""
    from uni_agent.tool_calls import decoding_schema, tool_call_json_schema
    from uni_agent.tools.toolbox import tool_schemas

    path = tmp_path / "agents.yaml"
    path.write_text("- name: a\n  interaction: {tools_in: prompt, tool_call_parser: qwen3_coder, "
                    "constrain_tool_calls: true}\n")
    with pytest.raises(ConfigError, match="qwen3_coder.*cannot be constrained"):
        AgentConfigs.load(path)
    path.write_text("- name: a\n  interaction: {tools_in: prompt, tool_call_parser: hermes, "
                    "constrain_tool_calls: true}\n")
    assert AgentConfigs.load(path).validated["a"].interaction.constrain_tool_calls
    schemas = tool_schemas(["execute_bash", "submit"])
    assert decoding_schema(schemas, "hermes") == tool_call_json_schema(schemas)
    assert decoding_schema(schemas, "qwen3_coder") is None


def test_a_deployment_rejects_fields_its_type_does_not_use(tmp_path: Path) -> None:
    """`proxy` reaches a remote provider and `image` names what a sandbox runs: a local sandbox takes an image (its
    root filesystem) but no proxy, the memory stand-in neither; both used to be accepted and ignored."""
    path = tmp_path / "agents.yaml"
    for deployment, field in (("{type: local, proxy: 'http://p:3128'}", "proxy"),
                              ("{type: memory, image: debian}", "image")):
        path.write_text(f"- name: a\n  env: {{deployment: {deployment}}}\n")
        with pytest.raises(ConfigError, match=field):
            AgentConfigs.load(path)
    path.write_text("- name: a\n  env: {deployment: {type: local, image: 'oci:/images/debian'}}\n")
    assert AgentConfigs.load(path).validated["a"].env.deployment.image == "oci:/images/debian"
