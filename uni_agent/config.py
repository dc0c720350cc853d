"""The agent config YAML (a list of agents in the seed's shape), validated with pydantic.

Every model forbids unknown keys, so a typo is an error naming the file and the field instead of a silently ignored
setting. A dataset row's `extra_info.tools_kwargs` is deep-merged over the agent's YAML entry (the row wins) and the
merged dict is validated again, so a bad row is reported with its index. A run setting that reaches every agent
(`--max-turns`) is merged last, over the row: what the user asked for this run wins over the data
(docs/configuration.md, "Precedence").

One file (over 300 lines) on purpose: it is the reference for every key of the YAML, read top to bottom by users
writing one; each class is small and the file holds nothing but the models and their loading.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from .registry import Registry, import_object
from .tool_calls.registry import TEXT_FORMATS
from .tools.registry import TOOLS

TOOL_NAMES = tuple(TOOLS.names())  # the default tool list: every built-in tool, in registry order
LOOP_TARGET = "uni_agent.episode.agent_loop.UniAgentLoop"
# The seed's spelling of the loop, in users' YAML files: the same class (uni_agent/agent_loop.py re-exports it).
TARGET_ALIASES = {"uni_agent.agent_loop.UniAgentLoop": LOOP_TARGET}
# The agent config a run uses when none is named (RunSettings.agent_config_path): shipped inside the package, so an
# install from a wheel has it; examples/agent_interaction/agent_config_local.yaml is a link to it.
DEFAULT_AGENT_CONFIG = Path(__file__).resolve().parent / "defaults" / "agent_config.yaml"


class ConfigError(ValueError):
    """A config file or row is invalid. The message names the file or row and the field."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeploymentBase(StrictModel):
    """What every sandbox backend's config has. A backend is a subclass that sets `type` and `sandbox_class`, registered
    in DEPLOYMENTS (or named by its import path in `type`, which then is a plain `str` field)."""

    sandbox_class: ClassVar[Any]
    """The backend's Sandbox class, or its "module:Class" path, imported only where a sandbox starts (so an optional
    SDK such as modal's is needed only there); made with (config, env_variables, name=...)."""
    type: str
    """The backend: a name in DEPLOYMENTS, or the import path of its config class."""
    startup_timeout: float = 600
    """Seconds allowed for the sandbox to start (per attempt)."""
    runtime_timeout: float = 300
    """Upper bound on any single command in the sandbox."""
    deployment_timeout: float = 3600
    """Lifetime of the sandbox; the rollout is ended when it is reached."""
    start_retries: int = 3
    """Attempts at starting a sandbox before the rollout fails (transient errors only)."""


class ImageDeploymentBase(DeploymentBase):
    """A deployment whose sandboxes run a container image, through a provider the driver may reach via a proxy."""

    image: str | None = None
    """Container image (a registry reference, or for `local` also an OCI layout or archive: see image_store.py)."""
    proxy: str | None = None
    """Proxy for reaching the image registry or the sandbox provider."""


class LocalDeploymentConfig(DeploymentBase):
    """A bubblewrap sandbox on this machine. Its root is the host's filesystem, read-only, or with `image` the image's
    root filesystem, copy-on-write; the task repo (`repo`, if given) is mounted copy-on-write at `workdir`."""

    sandbox_class: ClassVar[Any] = "uni_agent.sandbox.local:LocalSandbox"
    type: Literal["local"] = "local"
    image: str | None = None
    """A container image to run in, unpacked once per node (no container runtime needed): a registry reference
    (fetched with skopeo, or from a local podman), `oci:DIR[:TAG]`, `oci-archive:FILE` or `docker-archive:FILE`.
    Its Env, WorkingDir and User apply. None: the host's own /usr, read-only."""
    repo: str | None = None
    """The task repository: a directory, or `bundled:<instance_id>` for a bundled task. Optional with `image`
    (the image's own `workdir` then, e.g. SWE-bench's /testbed)."""
    workdir: str = "/testbed"
    network: bool = False
    workspace: Literal["auto", "overlay", "copy"] = "auto"
    """overlay: copy-on-write through overlayfs (as root, or without root in a user namespace of the sandbox's own);
    copy: a full copy at every start; auto: overlay where the kernel allows one (else a copy, said once in the log)."""
    max_memory_mb: int | None = 4096
    """RLIMIT_AS per process inside the sandbox, in MiB; None for no limit."""
    pids_limit: int | None = Field(default=1024, ge=16)
    """Processes (and threads) the whole sandbox may run at once, so a fork bomb stays inside it: a pids cgroup per
    sandbox where one is writable (root), else `ulimit -u` (binds non-root workers only); None for no limit."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """Host directories bound read-only into the sandbox, {path inside: directory on the host}: a program's prepared
    environment (uni_agent.harness; `harness.mounts` adds to these). Choose paths outside /usr (e.g. /opt/NAME)."""
    cpu_nice: int = Field(default=0, ge=0, le=19)
    """How far below the worker the sandbox's processes run for the CPU, as `nice` counts (0: level with it, 19:
    last): a polite setting for a node shared with others. Not a speed-up: at 10 the rollouts ran no faster, and on
    16 cores slower, their sandbox starts and commands waiting longer (docs/benchmarks.md, "Sandbox sessions and CPU
    priority")."""
    launcher: Literal["auto", "fork_server", "bwrap"] = "auto"
    """How a sandbox is started. fork_server: forked by the worker's fork server, a process that pays for bwrap and
    the interpreter once (one per worker process; ~3 ms of CPU a start); bwrap: a bwrap, a mount and a Python
    interpreter of its own (~30 ms); auto: the fork server where it serves the sandbox (the host's root, an overlay
    workspace, no network, no extra mounts) and works on this machine."""


class ContainerDeploymentConfig(ImageDeploymentBase):
    """A long-lived container per sandbox, driven through the docker or podman CLI (`type` picks the CLI).

    The image must hold the task repository at `workdir` (SWE-bench images hold /testbed), or `repo` names one to
    copy in at start. The defaults are those that work with rootful podman + runc on Debian (see docs/sandboxes.md)."""

    sandbox_class: ClassVar[Any] = "uni_agent.sandbox.container:ContainerSandbox"
    type: Literal["docker", "podman"] = "podman"
    repo: str | None = None
    """A repository to copy into `workdir` at start: a directory, or `bundled:<instance_id>`. None: the image's."""
    workdir: str = "/testbed"
    pull: Literal["never", "missing", "always"] = "missing"
    """never: the image must be present locally; missing: pull when absent; always: pull before every start."""
    network: str = "none"
    """`none` (no network), or a network the CLI knows (`bridge`, `host`, a named network)."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """Host directories bound read-only into the sandbox, {path inside: directory on the host}: a program's prepared
    environment (uni_agent.harness; `harness.mounts` adds to these). Choose paths outside /usr (e.g. /opt/NAME)."""
    cpus: float | None = Field(default=None, gt=0)
    memory: str | None = "4g"
    """Memory limit in the CLI's syntax (`512m`, `4g`); None for no limit."""
    pids_limit: int | None = Field(default=4096, ge=1)
    ulimits: list[str] = Field(default_factory=lambda: ["nofile=4096:4096", "nproc=4096:4096"])
    """`--ulimit` values; podman's own defaults fail where root lacks CAP_SYS_RESOURCE, so they are explicit."""
    runtime: str | None = "runc"
    """OCI runtime (`--runtime`); None for the engine's default. Debian's podman needs runc (crun fails there)."""
    init: bool = True
    """Run an init process as PID 1 (`--init`), which reaps the zombies of killed commands."""
    cli: str | None = None
    """Path of the CLI binary; default: `docker` or `podman` from PATH, after `type`."""
    run_args: list[str] = Field(default_factory=list)
    """Extra arguments for `run` (before the image), e.g. ["--security-opt", "label=disable"]."""
    max_starting: int = Field(default=8, ge=1)
    """Containers of this process that may be starting at once."""


class ModalDeploymentConfig(ImageDeploymentBase):
    """A Modal sandbox (modal SDK, `pip install 'uni-agent[modal]'`), from a registry image."""

    sandbox_class: ClassVar[Any] = "uni_agent.sandbox.modal:ModalSandbox"
    type: Literal["modal"] = "modal"
    app_name: str = "uni-agent"
    """The Modal app the sandboxes belong to (looked up, created if missing)."""
    environment_name: str | None = None
    repo: str | None = None
    """A repository to upload into `workdir` at start (a directory or `bundled:<id>`); None: the image's."""
    workdir: str = "/testbed"
    cpu: float | None = Field(default=None, gt=0)
    memory: int | None = Field(default=None, ge=1)
    """MiB."""
    block_network: bool = True
    """Cut the sandbox off the network (the other backends are offline by default too)."""
    add_python: str | None = None
    """Have Modal add a Python of this version to the image (`Image.from_registry(..., add_python=)`)."""
    max_starting: int = Field(default=32, ge=1)
    """Sandboxes of this process that may be starting (created, not yet answering) at once."""
    creates_per_second: float = Field(default=4.0, gt=0)
    """Sandbox.create calls per second from this process (Modal rate-limits creates per account)."""
    modal_sandbox_kwargs: dict[str, Any] = Field(default_factory=dict)
    """More keyword arguments for `modal.Sandbox.create` (e.g. region, gpu, idle_timeout)."""

    @field_validator("modal_sandbox_kwargs")
    @classmethod
    def _not_ours(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        owned = {"app", "image", "timeout", "workdir", "cpu", "memory", "block_network", "name", "tags"}
        clash = sorted(owned & set(kwargs))
        if clash:
            raise ValueError(f"{clash} are set by their own deployment fields, not modal_sandbox_kwargs")
        return kwargs


class MemoryDeploymentConfig(DeploymentBase):
    """Not a sandbox: a stand-in for the data plane in `uni-agent bench --simulate` (uni_agent/sandbox/memory.py).
    Every command takes `command_s` seconds and returns `output`; nothing runs. For measuring the control plane."""

    sandbox_class: ClassVar[Any] = "uni_agent.sandbox.memory:MemorySandbox"
    type: Literal["memory"] = "memory"
    workdir: str = "/testbed"
    start_s: float = Field(default=0.0, ge=0)
    """Seconds a start takes."""
    command_s: float = Field(default=0.05, ge=0)
    """Seconds every command takes."""
    output: str = "ok\n"
    """What every command prints (the patch command prints nothing)."""


# deployment `type` → its config class, which names its sandbox class. A backend from outside the package is named by
# its config class's import path in `type` (it reaches every worker that can import it), or registered here.
DEPLOYMENTS: Registry[type[DeploymentBase]] = Registry("deployment type", {
    "local": LocalDeploymentConfig,
    "docker": ContainerDeploymentConfig,
    "podman": ContainerDeploymentConfig,
    "modal": ModalDeploymentConfig,
    "memory": MemoryDeploymentConfig,
})


def deployment_config(value: dict[str, Any]) -> DeploymentBase:
    """A deployment mapping validated by the config class its `type` names (`local` when it names none)."""
    config_class = DEPLOYMENTS.get(value.get("type", "local"))
    if not (isinstance(config_class, type) and issubclass(config_class, DeploymentBase)):
        raise ValueError(f"type {value['type']!r} names {config_class!r}, not a subclass of "
                         "uni_agent.config.DeploymentBase")
    return config_class.model_validate(value)


class EnvConfig(StrictModel):
    deployment: SerializeAsAny[DeploymentBase] = Field(default_factory=LocalDeploymentConfig)
    """Where the sandbox lives: `type` picks the backend (DEPLOYMENTS), the other keys are that backend's config."""
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
    uni_agent.tool_calls.registry (qwen3_coder, hermes), the values of vLLM's `--tool-call-parser` (the run setting
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
    """A name in uni_agent.tools.registry."""

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
    target: str = Field(default=LOOP_TARGET, alias="_target_")
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
    def _importable(cls, target: str) -> str:
        target = TARGET_ALIASES.get(target, target)
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
