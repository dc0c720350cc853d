"""Run settings: where their defaults live (RunSettings' fields, once), the rendered settings/default.yaml and the
shipped agent config that cannot drift from them, precedence (file < environment < keywords), and the errors."""

from __future__ import annotations

import fnmatch
import os
import tomllib
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr, ValidationError

import uni_agent
from uni_agent.config import DEFAULT_AGENT_CONFIG, AgentConfigs, ConfigError
from uni_agent.settings import REPO_ROOT, RunSettings, load_settings
from uni_agent.settings_reference import defaults, render

EXAMPLE_CONFIG = REPO_ROOT / "examples" / "agent_interaction" / "agent_config_local.yaml"
PACKAGE_DIR = Path(uni_agent.__file__).parent


@pytest.fixture
def settings_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean environment: no UNI_AGENT_* run setting leaks in from the caller; the settings file is a tmp one."""
    for key in list(os.environ):
        if key.startswith("UNI_AGENT_") and key not in ("UNI_AGENT_SANDBOX_ROOT", "UNI_AGENT_CACHE_DIR"):
            monkeypatch.delenv(key)
    path = tmp_path / "settings.yaml"
    path.write_text("# empty: every field at its default\n")
    monkeypatch.setenv("UNI_AGENT_SETTINGS_FILE", str(path))
    return path


def test_settings_file_that_does_not_exist_is_an_error(settings_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNI_AGENT_SETTINGS_FILE", str(settings_env.parent / "nope.yaml"))
    with pytest.raises(ConfigError, match="nope.yaml: no such file"):
        load_settings()


def test_load_settings_names_the_field_and_the_file(settings_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings_env.write_text("n: 2\nturbo: true\n")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "turbo" in str(info.value) and str(settings_env) in str(info.value)
    settings_env.write_text("n: 2\n")
    monkeypatch.setenv("UNI_AGENT_N", "several")
    with pytest.raises(ConfigError, match="UNI_AGENT_N should be a valid integer"):  # named as the variable
        load_settings()
    assert load_settings(load_settings(n=5), max_turns=2).n == 5


def test_settings_precedence_file_env_kwargs(settings_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings_env.write_text("n: 3\nmax_turns: 4\ntemperature: 0.1\noutput_dir: /from/file\nengine: external\n")
    from_file = RunSettings()
    assert (from_file.n, from_file.max_turns, from_file.temperature) == (3, 4, 0.1)
    assert from_file.output_dir == "/from/file"
    assert from_file.engine == "external"
    assert from_file.top_p == 0.9  # not in the file: the class default

    monkeypatch.setenv("UNI_AGENT_MAX_TURNS", "5")
    monkeypatch.setenv("UNI_AGENT_TEMPERATURE", "0.2")
    from_env = RunSettings()
    assert (from_env.n, from_env.max_turns, from_env.temperature) == (3, 5, 0.2)

    from_kwargs = RunSettings(temperature=0.7, n=8)
    assert (from_kwargs.n, from_kwargs.max_turns, from_kwargs.temperature) == (8, 5, 0.7)
    assert from_kwargs.output_dir == "/from/file"


def test_settings_unknown_key_in_file_is_an_error(settings_env: Path) -> None:
    settings_env.write_text("n: 2\nmax_turn: 4\n")
    with pytest.raises(ValidationError) as info:
        RunSettings()
    assert "max_turn" in str(info.value)
    assert "Extra inputs" in str(info.value)


def test_settings_bad_env_value_is_an_error(settings_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNI_AGENT_N", "several")
    with pytest.raises(ValidationError) as info:
        RunSettings()
    assert "n" in {str(e["loc"][0]) for e in info.value.errors()}


def test_settings_api_key_is_secret(settings_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-test-DO-NOT-LEAK-1234567890"
    monkeypatch.setenv("UNI_AGENT_API_KEY", key)
    settings = RunSettings()
    assert isinstance(settings.api_key, SecretStr)
    assert settings.api_key_value() == key
    for text in (repr(settings.api_key), str(settings.api_key), repr(settings), str(settings),
                 settings.model_dump_json()):
        assert key not in text
    assert RunSettings(api_key="other-secret").api_key_value() == "other-secret"
    assert "other-secret" not in repr(RunSettings(api_key="other-secret"))


def test_settings_without_api_key(settings_env: Path) -> None:
    settings = RunSettings()
    assert settings.api_key is None
    assert settings.api_key_value() is None
    assert settings.sampling() == {"temperature": 0.8, "top_p": 0.9, "max_tokens": 512}


# -- where the defaults live ---------------------------------------------------------------------------------------


def test_settings_default_yaml_is_rendered_from_the_fields() -> None:
    """settings/default.yaml is a copy of RunSettings' defaults and docstrings: a default changed in one place and not
    the other fails here (render it again with `python -m uni_agent.settings_reference > settings/default.yaml`)."""
    written = (REPO_ROOT / "settings" / "default.yaml").read_text()
    assert written == render(), "settings/default.yaml differs from RunSettings: python -m uni_agent.settings_reference"
    assert yaml.safe_load(written) == defaults()
    assert set(defaults()) == set(RunSettings.model_fields)  # every setting, none left out


def test_the_defaults_need_no_file_and_the_rendered_file_reads_back_as_them(
        settings_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Run from anywhere (a wheel install has no settings/ beside it), nothing names a settings file: the fields are
    the defaults, and the agent config is the one shipped in the package."""
    monkeypatch.delenv("UNI_AGENT_SETTINGS_FILE")
    monkeypatch.chdir(tmp_path)
    plain = RunSettings()
    assert plain.agent_config_path == str(DEFAULT_AGENT_CONFIG)
    assert plain.max_turns is None and plain.n == 1 and plain.engine == "llama_cpp"
    settings_env.write_text(render())  # the rendered file, used as a settings file, changes nothing
    monkeypatch.setenv("UNI_AGENT_SETTINGS_FILE", str(settings_env))
    assert RunSettings() == plain
    settings_env.write_text("agent_config_path: mine.yaml\n")
    assert RunSettings().agent_config_path == "mine.yaml"


def test_the_default_agent_config_ships_in_the_package_and_the_example_is_a_link_to_it() -> None:
    assert DEFAULT_AGENT_CONFIG.is_file() and DEFAULT_AGENT_CONFIG.is_relative_to(PACKAGE_DIR)
    assert EXAMPLE_CONFIG.is_symlink() and EXAMPLE_CONFIG.resolve() == DEFAULT_AGENT_CONFIG.resolve()
    package_data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    relative = str(DEFAULT_AGENT_CONFIG.relative_to(PACKAGE_DIR))
    assert any(fnmatch.fnmatch(relative, pattern) for pattern in package_data["uni_agent"]), package_data
    for pattern in package_data["uni_agent"]:  # every pattern names files that exist (no `prompts/*` of nothing)
        assert list(PACKAGE_DIR.glob(pattern)), f"package data {pattern!r} matches no file"
    agent = AgentConfigs.load(DEFAULT_AGENT_CONFIG).validated["swe_agent"]
    assert agent.env.deployment.type == "local" and agent.interaction.max_turns == 6


def test_old_setting_names_are_unknown_settings(settings_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """n_workers and num_workers (renamed local_workers and agent_workers before any release) are not kept alive:
    each is refused where it is written, with the closest current name where one is close."""
    with pytest.raises(ConfigError, match=r"^num_workers: unknown setting"):
        load_settings(num_workers=5)
    monkeypatch.setenv("UNI_AGENT_N_WORKERS", "4")
    with pytest.raises(ConfigError, match=r"^unknown environment variable UNI_AGENT_N_WORKERS"):
        load_settings()
    monkeypatch.delenv("UNI_AGENT_N_WORKERS")
    settings_env.write_text("num_workers: 7\n")
    with pytest.raises(ConfigError, match=f"^{settings_env}: num_workers: unknown setting"):
        load_settings()


def test_eval_timeout_flag_bounds_every_rows_grading_over_the_rows_own(tmp_path):
    """`uni-agent verify --eval-timeout 1800` (SWE-bench's official limit) reaches every row's agent, over a value
    the row's tools_kwargs set; without it each row keeps its own."""
    import pyarrow.parquet as pq

    from uni_agent.cli import build_parser, settings_from
    from uni_agent.driver.inputs import load_inputs
    from uni_agent.tasks.swe_form import convert

    convert(None, tmp_path / "rows.parquet")
    rows = pq.read_table(tmp_path / "rows.parquet").to_pylist()[:2]
    rows[0]["extra_info"]["tools_kwargs"].setdefault("reward", {})["eval_timeout"] = 7
    args = build_parser().parse_args(["verify", "--eval-timeout", "1800", "--output-dir", str(tmp_path / "v")])
    settings = settings_from(args)
    assert settings.eval_timeout == 1800
    given = load_inputs(rows, None, settings, tmp_path / "v", run_id="t", n=1, purpose="verify")
    assert [s.agent.reward.eval_timeout for s in given.specs] == [1800, 1800]
    own = load_inputs(rows, None, load_settings(), tmp_path / "w", run_id="t", n=1, purpose="verify")
    assert own.specs[0].agent.reward.eval_timeout == 7 and own.specs[1].agent.reward.eval_timeout != 1800


def test_a_settings_file_with_a_key_that_others_can_read_is_refused(settings_env: Path) -> None:
    """The endpoint's key in a file other users of the node can read (a clone's files are 0644, Debian's homes 0755)
    would let them use the endpoint as the run: refused, naming the file and the fix, the key itself never shown."""
    key = "sk-test-DO-NOT-LEAK-0987654321"
    settings_env.write_text(f"api_key: {key}\nn: 2\n")
    settings_env.chmod(0o644)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert str(settings_env) in message and "chmod 600" in message and "UNI_AGENT_API_KEY" in message, message
    assert "0644" in message and key not in message, message

    settings_env.chmod(0o640)  # the group is other users too
    with pytest.raises(ConfigError):
        load_settings()

    settings_env.chmod(0o600)
    settings = load_settings()
    assert settings.api_key_value() == key and settings.n == 2

    settings_env.write_text("n: 3\n")  # no secret: any mode will do
    settings_env.chmod(0o644)
    assert load_settings().n == 3
