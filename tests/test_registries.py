"""Tools, tool-call text formats and engines are found by name in registries: a new one is one registration (no
if-chain to extend), and config, the CLI and a run (its engine, before anything starts) check names against the
registries, so an unknown name is an error naming it and listing the known ones."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from uni_agent.cli import build_parser, main
from uni_agent.config import AgentConfigs, ConfigError, validate_agent
from uni_agent.engines import Engines, check_engine, start_engines
from uni_agent.engines.engine_names import ENGINES
from uni_agent.registry import Registry, UnknownName
from uni_agent.settings import RunSettings, load_settings
from uni_agent.tool_calls import (
    TEXT_FORMATS,
    ParsedReply,
    ToolCall,
    ToolCallFormatError,
    parse_text,
    text_format,
    tool_format_instructions,
)
from uni_agent.tool_calls.prompt import tools_section
from uni_agent.tool_calls.schemas import example_call
from uni_agent.tool_calls.text_format import finish_reply
from uni_agent.tools.base import ToolReply
from uni_agent.tools.tool_names import TOOLS
from uni_agent.tools.toolbox import Toolbox, tool_schemas

TOOLS_SCHEMAS = tool_schemas(["execute_bash", "submit"])


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNI_AGENT_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("UNI_AGENT_CACHE_DIR", str(tmp_path / "cache"))


def agent(**interaction: Any) -> dict[str, Any]:
    return {"name": "a", "env": {"deployment": {"type": "local", "repo": "bundled:uni-agent__romanum-4"}},
            "interaction": interaction}


# --- the registry itself --------------------------------------------------------------------------------------------


def test_registry_imports_a_path_entry_on_first_use_and_rejects_a_second_registration():
    things: Registry[Any] = Registry("thing", {"dumps": "json:dumps"})
    assert things.names() == ["dumps"] and "dumps" in things
    assert things.get("dumps") is json.dumps
    with pytest.raises(ValueError, match="thing 'dumps' is already registered"):
        things.register("dumps", json.loads)
    things.register("dumps", json.loads, replace=True)
    assert things.get("dumps") is json.loads
    with pytest.raises(UnknownName, match=r"^unknown thing 'load'; known things: dumps \(or package.module:Object\)$"):
        things.get("load")


def test_an_import_path_names_an_object_without_registering_it():
    """"package.module:Object" works wherever a name does, in any process that can import the module; a path that
    does not import is an UnknownName saying why, checked as early as a name."""
    things: Registry[Any] = Registry("thing", {"dumps": "json:dumps"})
    assert things.check("json:loads") == "json:loads" and things.get("json:loads") is json.loads
    assert things.get("os.path:join.__name__") == "join"
    assert things.names() == ["dumps"]  # a path is not a registration
    with pytest.raises(UnknownName, match=r"^cannot import thing 'no_such_module_xyz:X': ModuleNotFoundError: No "):
        things.check("no_such_module_xyz:X")
    with pytest.raises(UnknownName, match=r"^cannot import thing 'json:nope': AttributeError: .*'nope'"):
        things.get("json:nope")


# --- tool-call text formats -----------------------------------------------------------------------------------------


class LineFormat:
    """A made-up format, one call per line: `CALL <tool> <JSON arguments>`."""

    name = "line"

    def instructions(self, tools: list[dict]) -> str:
        return tools_section(tools, ["Write each call on its own line: CALL TOOL_NAME {JSON arguments}"],
                             self.format_call(*example_call(tools)))

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"CALL {name} {json.dumps(arguments)}"

    def parse(self, text: str, tools: list[dict]) -> ParsedReply:
        thought, raw_calls = [], []
        for line in text.splitlines():
            if line.startswith("CALL "):
                name, _, arguments = line[5:].partition(" ")
                raw_calls.append((name, json.loads(arguments or "{}")))
            else:
                thought.append(line)
        return finish_reply(thought, raw_calls, tools)

    def decoding_schema(self, tools: list[dict]) -> dict[str, Any] | None:
        return None


@pytest.fixture
def line_format():
    TEXT_FORMATS.register("line", LineFormat())
    yield
    TEXT_FORMATS.unregister("line")


def test_a_registered_format_is_used_for_parsing_and_prompt_text(line_format):
    reply = parse_text('Listing first.\nCALL execute_bash {"command": 5}', TOOLS_SCHEMAS, "line")
    assert reply.thought == "Listing first."
    # the one validator ran: the number became the string the schema asks for, and the call got an id
    (call,) = reply.calls
    assert (call.name, call.arguments) == ("execute_bash", {"command": "5"}) and call.id.startswith("call_")
    with pytest.raises(ToolCallFormatError, match='Unknown tool "rm". Available tools: execute_bash, submit'):
        parse_text("CALL rm {}", TOOLS_SCHEMAS, "line")

    prompt = tool_format_instructions(TOOLS_SCHEMAS, "line")
    assert "## execute_bash" in prompt and "CALL TOOL_NAME {JSON arguments}" in prompt
    assert prompt.endswith('Example:\nCALL execute_bash {"command": "ls -la"}')

    assert validate_agent(agent(tool_call_parser="line"), "test").interaction.tool_call_parser == "line"


def test_an_unregistered_format_is_gone_again():
    assert "line" not in TEXT_FORMATS  # the fixture above cleaned up (else other tests would see a third format)
    with pytest.raises(ValueError, match=r"unknown tool-call text format 'line'; known tool-call text formats: "
                                         r"qwen3_coder, hermes"):
        text_format("line")


def test_unknown_format_in_config_names_it_and_lists_the_known(tmp_path):
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump([agent(tool_call_parser="xml")]))
    with pytest.raises(ConfigError) as err:
        AgentConfigs.load(path)
    assert "interaction.tool_call_parser" in str(err.value)
    assert "unknown tool-call text format 'xml'; known tool-call text formats: qwen3_coder, hermes" in str(err.value)


# --- tools ----------------------------------------------------------------------------------------------------------


class Echo:
    SCHEMA = {"type": "function", "function": {
        "name": "echo", "description": "Say it back.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}

    def __init__(self, sandbox, interaction):
        self.prefix = f"({interaction.max_observation_chars}) "

    async def run(self, arguments: dict[str, Any]) -> ToolReply:
        return ToolReply(self.prefix + arguments["text"], "ok")


def test_a_registered_tool_is_accepted_by_config_and_run_by_the_toolbox():
    TOOLS.register("echo", Echo)
    try:
        config = validate_agent({**agent(max_observation_chars=99), "tools": [{"name": "echo"}, {"name": "submit"}]},
                                "test")
        toolbox = Toolbox([t.name for t in config.tools], sandbox=None, interaction=config.interaction)
        assert [s["function"]["name"] for s in toolbox.schemas] == ["echo", "submit"]
        outcome = asyncio.run(toolbox.run(ToolCall("call_1", "echo", {"text": "hi"})))
        assert (outcome.observation, outcome.status, outcome.submitted) == ("(99) hi", "ok", False)
        assert asyncio.run(toolbox.run(ToolCall("call_2", "submit", {}))).submitted
    finally:
        TOOLS.unregister("echo")
    with pytest.raises(ConfigError, match="tools.0.name: Value error, unknown tool 'echo'; known tools: "
                                          "str_replace_editor, execute_bash, submit"):
        validate_agent({**agent(), "tools": [{"name": "echo"}]}, "test")


def test_unknown_tool_in_the_toolbox_names_it_and_lists_the_known():
    with pytest.raises(UnknownName, match="unknown tool 'grep'; known tools: str_replace_editor, execute_bash"):
        Toolbox(["grep"], sandbox=None, interaction=validate_agent(agent(), "test").interaction)


# --- engines --------------------------------------------------------------------------------------------------------


def test_unknown_engine_names_the_setting_as_given_and_lists_the_known(capsys, monkeypatch):
    """Settings know no engine (the engines read them): check_engine checks the name before a run starts, naming the
    setting as the user wrote it (keyword, flag, variable, also through a `base`), with the closest known name."""
    with pytest.raises(ConfigError, match=r"^engine: unknown engine 'sglang'; known engines: llama_cpp, external, "
                                          r"vllm \(or module:function\)$"):
        check_engine(load_settings(engine="sglang"))
    with pytest.raises(ConfigError, match=r"^--engine: unknown engine 'llama-cpp' \(did you mean llama_cpp\?\); "):
        check_engine(load_settings(load_settings(flags={"engine": "--engine"}, engine="llama-cpp"), n=2))
    monkeypatch.setenv("UNI_AGENT_ENGINE", "vlm")
    with pytest.raises(ConfigError, match=r"^UNI_AGENT_ENGINE: unknown engine 'vlm' \(did you mean vllm\?\); "):
        check_engine(load_settings(load_settings()))
    monkeypatch.delenv("UNI_AGENT_ENGINE")
    with pytest.raises(ConfigError, match=r"^engine: cannot import engine 'nosuchpkg.engines:start': "
                                          r"ModuleNotFoundError: No module named 'nosuchpkg'$"):
        check_engine(load_settings(engine="nosuchpkg.engines:start"))
    for name in [*ENGINES, "uni_agent.engines.external:external_engines"]:
        check_engine(load_settings(engine=name))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--engine", "sglang"])
    assert "invalid choice: 'sglang' (choose from 'llama_cpp', 'external', 'vllm', or module:function)" in \
        capsys.readouterr().err
    assert build_parser().parse_args(["run", "--engine", "mypkg.engines:start"]).engine == "mypkg.engines:start"


def test_an_unknown_engine_in_the_environment_stops_the_run_before_it_writes_anything(capsys, monkeypatch,
                                                                                      tmp_path):
    """`uni-agent run` and run(): the engine is checked (check_engine) before the output dir, run.json or a cluster."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("UNI_AGENT_ENGINE", "sglang")
    assert main(["run", "--max-samples", "1"]) == 2
    assert capsys.readouterr().err == ("error: UNI_AGENT_ENGINE: unknown engine 'sglang'; known engines: llama_cpp, "
                                       "external, vllm (or module:function)\n")
    monkeypatch.delenv("UNI_AGENT_ENGINE")
    from uni_agent.driver.run import run

    with pytest.raises(ConfigError, match=r"^engine: unknown engine 'vlm' \(did you mean vllm\?\)"):
        run(engine="vlm", output_dir=str(tmp_path / "out"), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_session_checks_the_engine_before_its_cluster_starts(monkeypatch, tmp_path):
    """run(), the rollout service and any other caller of open_session: a wrong engine starts no cluster."""
    from uni_agent.driver import session

    def no_cluster(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the cluster was started")

    async def open_one() -> None:
        async with session.open_session(load_settings(engine="sglang"), tmp_path):
            pass

    monkeypatch.setattr(session, "cluster_client", no_cluster)
    with pytest.raises(ConfigError, match=r"^engine: unknown engine 'sglang'; known engines: "):
        asyncio.run(open_one())


def test_a_registered_engine_passes_the_check_and_is_started_by_name():
    started = []

    async def start_echo_engine(client: Any, settings: RunSettings, log_dir: str) -> Engines:
        started.append((client, log_dir))
        return Engines(urls=["http://127.0.0.1:1/v1"], model_name="echo")

    ENGINES.register("echo", start_echo_engine)
    try:
        settings = load_settings(engine="echo")
        check_engine(settings)
        engines = asyncio.run(start_engines("the client", settings, "/tmp/logs"))
        assert engines.model_name == "echo" and started == [("the client", "/tmp/logs")]
    finally:
        ENGINES.unregister("echo")
    with pytest.raises(ConfigError, match="^engine: unknown engine 'echo'; known engines: llama_cpp, external, vllm"):
        check_engine(settings)
    with pytest.raises(UnknownName, match="unknown engine 'echo'; known engines: llama_cpp, external, vllm"):
        asyncio.run(start_engines(None, settings, "/tmp/logs"))  # as if the check were skipped


def test_every_deployment_type_names_a_sandbox_backend_and_a_new_one_is_one_registration() -> None:
    """A deployment `type` picks a config class in DEPLOYMENTS, whose build() makes its backend's sandbox: a new
    backend is one config class registered (no union or chain to extend)."""
    from uni_agent.config import EnvConfig
    from uni_agent.sandbox import DeploymentBase, Sandbox
    from uni_agent.sandbox.memory import MemoryDeploymentConfig, MemorySandbox
    from uni_agent.sandbox.deployment_types import DEPLOYMENTS

    assert DEPLOYMENTS.names() == ["local", "docker", "podman", "modal", "memory"]
    for name in DEPLOYMENTS:
        config_class = DEPLOYMENTS.get(name)
        assert issubclass(config_class, DeploymentBase) and config_class.model_config["extra"] == "forbid"
        assert config_class.build is not DeploymentBase.build, config_class
    assert isinstance(MemoryDeploymentConfig().build({}, "m"), MemorySandbox)
    assert isinstance(MemoryDeploymentConfig().build({}, "m"), Sandbox)

    class Recorded(MemorySandbox):
        pass

    class RecordedConfig(MemoryDeploymentConfig):
        type: str = "recorded"

        def build(self, env_variables: dict[str, str], name: str = "") -> Recorded:
            return Recorded(self, env_variables, name=name)

    DEPLOYMENTS.register("recorded", RecordedConfig)
    try:
        deployment = EnvConfig.model_validate({"deployment": {"type": "recorded", "command_s": 0}}).deployment
        assert type(deployment) is RecordedConfig and type(deployment.build({}, "m")) is Recorded
    finally:
        DEPLOYMENTS.unregister("recorded")
    with pytest.raises(UnknownName, match=r"unknown deployment type 'vefaas'; known deployment types: local, "):
        DEPLOYMENTS.get("vefaas")


def test_a_deployment_type_keeps_its_config_strict_and_its_errors_named(tmp_path: Path) -> None:
    """Keys the chosen backend does not have, a wrong value, an unknown type and a type that names something other
    than a deployment config are errors naming the field."""
    def error(deployment: dict[str, Any]) -> str:
        with pytest.raises(ConfigError) as caught:
            validate_agent({"name": "a", "env": {"deployment": deployment}}, "agents.yaml")
        return str(caught.value)

    assert "env.deployment.image_tag: Extra inputs are not permitted" in error({"type": "local", "image_tag": "x"})
    assert "env.deployment.workspace: Input should be 'auto', 'overlay' or 'copy'" in error(
        {"type": "local", "workspace": "tmpfs"})
    assert "env.deployment: Value error, unknown deployment type 'kubernetes'; known deployment types: local" in error(
        {"type": "kubernetes"})
    assert "env.deployment: Value error, type 'json:dumps' names <function dumps" in error({"type": "json:dumps"})
    no_type = validate_agent({"name": "a", "env": {"deployment": {"repo": "bundled:x"}}}, "here")
    assert no_type.env.deployment.type == "local" and no_type.env.deployment.repo == "bundled:x"
    dumped = no_type.model_dump(mode="json")["env"]["deployment"]
    assert dumped["type"] == "local" and dumped["workspace"] == "auto"  # every field of the backend's config
