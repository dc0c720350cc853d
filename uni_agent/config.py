"""The agent config YAML (a list of agents in the seed's shape), validated with pydantic.

Every model forbids unknown keys, so a typo is an error naming the file and the field instead of a silently ignored
setting. A dataset row's `extra_info.tools_kwargs` is deep-merged over the agent's YAML entry (the row wins) and the
merged dict is validated again, so a bad row is reported with its index. A run setting that reaches every agent
(`--max-turns`) is merged last, over the row: what the user asked for this run wins over the data
(docs/configuration.md, "Precedence").

One file on purpose: it is the reference for every key of the YAML, read top to bottom by users writing one; each
class is small and the file holds nothing but the models and their loading. The keys of a sandbox backend
(`env.deployment`) are its config class's, beside the backend (uni_agent.sandbox.local:LocalDeploymentConfig, ...).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from .registry import import_object
from .sandbox.base import DeploymentBase
from .sandbox.deployment_types import deployment_config
from .tool_calls.format_names import TEXT_FORMATS
from .tools.tool_names import TOOLS

TOOL_NAMES = tuple(TOOLS.names())  # the default tool list: every built-in tool, in registry order
# The agent config a run uses when none is named (RunSettings.agent_config_path): shipped inside the package, so an
# install from a wheel has it; examples/agent_interaction/agent_config_local.yaml is a link to it.
DEFAULT_AGENT_CONFIG = Path(__file__).resolve().parent / "defaults" / "agent_config.yaml"


class ConfigError(ValueError):
    """A config file or row is invalid. The message names the file or row and the field."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvConfig(StrictModel):
    deployment: SerializeAsAny[DeploymentBase] = Field(default_factory=lambda: deployment_config({}))
    """Where the sandbox lives: `type` picks the backend (uni_agent.sandbox.deployment_types.DEPLOYMENTS; `local`
    when left out), the other keys are that backend's config."""
    env_variables: dict[str, str] = Field(default_factory=dict)
    post_setup_cmd: str = ""
    """Run once in the sandbox after it starts (e.g. install a package); a failure fails the rollout."""

    @field_validator("deployment", mode="before")
    @classmethod
    def _by_type(cls, value: Any) -> Any:
        return deployment_config(value) if isinstance(value, dict) else value

    @field_validator("env_variables")
    @classmethod
    def _shell_names(cls, variables: dict[str, str]) -> dict[str, str]:
        bad = [name for name in variables if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
        if bad:
            raise ValueError(f"not valid environment variable names: {bad}")
        return variables


class InteractionConfig(StrictModel):
    action_timeout: float = 60
    """Seconds a single tool command may run before it is killed."""
    max_turns: int = Field(default=50, ge=1)
    """Model calls an episode may make without a submit (then it ends as `max_turns`). 50 is for agent YAMLs that
    leave it out; the shipped agent (DEFAULT_AGENT_CONFIG, what a run uses by default) sets its own, and the run
    setting max_turns (--max-turns) overrides every agent for one run."""
    timeout_budget: int = Field(default=3, ge=0)
    """How many command timeouts a rollout may take; one more ends it with exit reason `command_timeouts`."""
    episode_timeout: float | None = None
    """Wall-clock seconds for the whole episode; when exceeded the rollout ends with `wall_clock`."""
    max_observation_chars: int = 16000
    tool_call_parser: str = "hermes"
    """Format used to read tool calls written as text (structured `tool_calls` are always accepted): a name in
    uni_agent.tool_calls.format_names (qwen3_coder, hermes), the values of vLLM's `--tool-call-parser` (the run setting
    tool_call_parser tells a vLLM server the same)."""
    tools_in: Literal["api", "prompt"] = "api"
    """api: send tool schemas in the request; prompt: describe them in the system prompt (for servers whose chat
    template ignores tools)."""
    constrain_tool_calls: bool = False
    """With tools_in=prompt: ask the server to constrain every reply to one valid JSON tool call
    (`response_format` with a JSON schema, as llama.cpp's server supports). Small models need it."""

    @field_validator("tool_call_parser")
    @classmethod
    def _known_format(cls, name: str) -> str:
        return TEXT_FORMATS.check(name)

    @model_validator(mode="after")
    def _constraint_needs_prompt_tools(self) -> InteractionConfig:
        if self.constrain_tool_calls and self.tools_in != "prompt":
            raise ValueError("constrain_tool_calls needs tools_in: prompt (with tools_in: api the server parses calls)")
        if self.constrain_tool_calls and TEXT_FORMATS.get(self.tool_call_parser).decoding_schema([]) is None:
            raise ValueError(f"constrain_tool_calls needs a tool_call_parser whose calls are JSON (hermes); "
                             f"{self.tool_call_parser!r} calls cannot be constrained by a JSON schema")
        return self


class ToolSpec(StrictModel):
    name: str
    """A name in uni_agent.tools.tool_names."""

    @field_validator("name")
    @classmethod
    def _known_tool(cls, name: str) -> str:
        return TOOLS.check(name)


class RewardConfig(StrictModel):
    name: str | None = None
    """The grader, a name in uni_agent.grading's registry: `swe_local` (bundled and user tasks in SWE-bench form),
    `swe_bench`, `swe_smith`, `terminal_bench`. Checked against the registry when rows are read."""
    eval_timeout: float = 600
    metadata: dict[str, Any] = Field(default_factory=dict)
    in_agent_sandbox: bool = False
    """Grade in the agent's own sandbox right after its episode, as Terminal-Bench does (the tests see everything
    the agent changed, installed packages included). False: in a fresh sandbox from the patch, as SWE-bench does."""


class HarnessConfig(StrictModel):
    """A program that brings its own agent loop (`_target_: uni_agent.harness.HarnessAgent`, docs/harness.md). It runs
    in the sandbox and reaches the model through the agent worker's gateway: OPENAI_BASE_URL and OPENAI_API_KEY (a
    token of the rollout's own, never the run's key) are set for it, with the sandbox's network still off."""

    command: str
    """Shell command (bash) run at the workdir. The task's prompt is in the file $UNI_AGENT_PROMPT_FILE and the
    variable $UNI_AGENT_PROMPT; the episode ends when the command exits (0: finished)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for the program (the gateway's OPENAI_* variables are set after these)."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """Read-only mounts {path in the sandbox: directory on the host}, e.g. a venv from `uni-agent harness prepare`
    (local, local over an image, podman, docker; for Modal, put the program into the image)."""
    timeout: float = Field(default=1800, gt=0)
    """Wall-clock seconds for the episode (bounded by interaction.episode_timeout and deployment_timeout too); then
    the program is killed and the episode ends as `wall_clock`."""
    max_calls: int | None = Field(default=None, ge=1)
    """Model calls the program may make (default: interaction.max_turns); one more is refused and ends the episode."""
    output_tail_chars: int = Field(default=4000, ge=0)
    """How much of the end of the program's output (stdout and stderr) the row's `harness` column keeps."""
    end_grace_s: float = Field(default=2.0, ge=0)
    """Once the gateway has ended the episode (a budget), seconds the program gets to exit before it is killed."""

    @field_validator("env")
    @classmethod
    def _env_names(cls, variables: dict[str, str]) -> dict[str, str]:
        return EnvConfig._shell_names(variables)

    @field_validator("mounts")
    @classmethod
    def _absolute(cls, mounts: dict[str, str]) -> dict[str, str]:
        bad = [inside for inside in mounts if not inside.startswith("/")]
        if bad:
            raise ValueError(f"mount points must be absolute paths in the sandbox: {bad}")
        return mounts


class AgentConfig(StrictModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    target: str | None = Field(default=None, alias="_target_")
    """The agent strategy, by import path (`uni_agent.harness.HarnessAgent`, `mypkg.agents:MyAgent`); None: our own
    loop, which `uni_agent.agent_loop.UniAgentLoop` (the seed's spelling) names too (uni_agent.episode.agent_loop)."""
    concurrency: int = Field(default=64, ge=1)
    """In-flight rollouts for this agent, across all agent workers."""
    log_dir: str | None = None
    mask_abnormal_exit_traj: bool = False
    interaction: InteractionConfig = Field(default_factory=InteractionConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    tools: list[ToolSpec] = Field(default_factory=lambda: [ToolSpec(name=n) for n in TOOL_NAMES])
    reward: RewardConfig = Field(default_factory=RewardConfig)
    system_prompt: str | None = None
    """Replaces the system message of each row's prompt when set."""
    harness: HarnessConfig | None = None
    """The program that is the agent, for `_target_: uni_agent.harness.HarnessAgent` (our own loop ignores it)."""

    @field_validator("target")
    @classmethod
    def _importable(cls, target: str | None) -> str | None:
        if target is None:
            return None
        try:
            import_object(target)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(f"cannot import {target!r}: {exc}") from None
        return target


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Dicts merge recursively; lists and scalars in `override` replace those in `base`. Inputs are not modified."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def format_validation_error(exc: ValidationError, where: str) -> str:
    lines = [f"{where}: invalid agent config"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"  {field}: {err['msg']}")
    return "\n".join(lines)


class AgentConfigs:
    """The agents of one YAML file: raw dicts (for merging rows over them) and their validated form. `overrides`
    (run settings that reach every agent) are merged last: YAML entry < row's tools_kwargs < overrides."""

    def __init__(self, raw: dict[str, dict[str, Any]], source: str, overrides: dict[str, Any] | None = None):
        self.raw = raw
        self.source = source
        self.overrides = overrides or {}
        self.validated = {name: validate_agent(entry, f"{source} (agent {name!r})")
                          for name, entry in self.entries.items()}

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        """Each agent as a row without tools_kwargs gets it: its YAML entry with the overrides merged in."""
        return {name: deep_merge(entry, self.overrides) for name, entry in self.raw.items()}

    @classmethod
    def load(cls, path: str | Path) -> AgentConfigs:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: agent config file not found") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from None
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list) or not data:
            raise ConfigError(f"{path}: expected a list of agents, each with a `name`")
        raw: dict[str, dict[str, Any]] = {}
        for index, entry in enumerate(data):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise ConfigError(f"{path}: agent #{index} is not a mapping with a string `name`")
            if entry["name"] in raw:
                raise ConfigError(f"{path}: agent name {entry['name']!r} appears twice")
            raw[entry["name"]] = entry
        return cls(raw, str(path))

    def names(self) -> list[str]:
        return list(self.raw)

    def for_row(self, agent_name: str, tools_kwargs: dict[str, Any] | None, where: str) -> AgentConfig:
        """The agent's config with the row's tools_kwargs merged over it (the row wins), then the overrides."""
        if agent_name not in self.raw:
            raise ConfigError(f"{where}: unknown agent_name {agent_name!r}; {self.source} defines {self.names()}")
        if not tools_kwargs:
            return self.validated[agent_name]
        if "model" in tools_kwargs:
            raise ConfigError(f"{where}: tools_kwargs.model is reserved (the model comes from the run settings)")
        return validate_agent(deep_merge(deep_merge(self.raw[agent_name], tools_kwargs), self.overrides), where)

    def override_all(self, overrides: dict[str, Any]) -> AgentConfigs:
        """A copy with `overrides` merged into every agent after each row's tools_kwargs (run settings such as
        --max-turns: an explicit setting wins over the data)."""
        return AgentConfigs(self.raw, self.source, deep_merge(self.overrides, overrides))


def validate_agent(entry: dict[str, Any], where: str) -> AgentConfig:
    try:
        return AgentConfig.model_validate(entry)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, where)) from None
