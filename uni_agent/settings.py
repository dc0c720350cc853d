"""Run settings: defaults in settings/default.yaml, overridden by UNI_AGENT_* environment variables, then by CLI
flags (passed as keyword arguments)."""

from __future__ import annotations

import contextlib
import difflib
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from .config import ConfigError
from .engines.registry import ENGINES

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SETTINGS_FILE = REPO_ROOT / "settings" / "default.yaml"
ENV_PREFIX = "UNI_AGENT_"
DEFAULT_RUN_OUTPUT_DIR = "outputs/run"  # when output_dir is null; verification uses outputs/verify-<patch>

# UNI_AGENT_* variables that are not run settings: read elsewhere in the project (sandboxes, setup.sh, the SLURM
# scripts, which export theirs into the driver's job). Any other UNI_AGENT_ variable is a typo and an error.
OTHER_VARIABLES = frozenset({
    "UNI_AGENT_SETTINGS_FILE", "UNI_AGENT_SANDBOX_ROOT", "UNI_AGENT_CACHE_DIR", "UNI_AGENT_PIDS_CGROUP",
    "UNI_AGENT_LLAMA_DIR", "UNI_AGENT_SHARED", "UNI_AGENT_VENV", "UNI_AGENT_REPO", "UNI_AGENT_SCHEDULER_PORT",
    "UNI_AGENT_DASHBOARD_HOST", "UNI_AGENT_DASHBOARD_PORT", "UNI_AGENT_GPUS_PER_NODE", "UNI_AGENT_SANDBOXES_PER_NODE",
    "UNI_AGENT_WORKER_ARGS", "UNI_AGENT_SCHEDULER_SBATCH", "UNI_AGENT_GPU_SBATCH", "UNI_AGENT_SANDBOX_SBATCH",
    "UNI_AGENT_IMAGE_CACHE", "UNI_AGENT_IMAGE_CACHE_GB", "UNI_AGENT_RUN_AS",  # sandbox/image_store.py, bwrap.py
    "UNI_AGENT_PREPULL", "UNI_AGENT_WORKERS_PER_NODE",  # cluster/sandbox-workers.sbatch
    # what a harness program finds in its sandbox (uni_agent/harness/agent.py), never read as settings
    "UNI_AGENT_MODEL", "UNI_AGENT_PROMPT", "UNI_AGENT_PROMPT_FILE", "UNI_AGENT_MESSAGES_FILE", "UNI_AGENT_WORKDIR",
    "UNI_AGENT_MAX_CALLS",
    "UNI_AGENT_DRIVER_STOPS_WORKER",  # uni_agent.worker_preload: a LocalCluster's worker leaves SIGINT to the driver
})

# Old setting names, still accepted as keywords, UNI_AGENT_* variables and settings-file keys, with a FutureWarning
# that names the new one: `n_workers` and `num_workers` sat side by side and counted different things. (The CLI keeps
# --n-workers and --num-workers, the seed's flag, as aliases of the new flags: uni_agent.cli.)
RENAMED = {"n_workers": "local_workers", "num_workers": "agent_workers"}


def settings_file() -> Path | None:
    chosen = os.environ.get("UNI_AGENT_SETTINGS_FILE")
    if chosen and not Path(chosen).is_file():
        raise ConfigError(f"UNI_AGENT_SETTINGS_FILE={chosen}: no such file")
    path = Path(chosen) if chosen else DEFAULT_SETTINGS_FILE
    return path if path.is_file() else None


class RunSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="UNI_AGENT_", extra="forbid", validate_default=True)

    # Where and what
    data_path: str | None = None
    agent_config_path: str = str(REPO_ROOT / "examples" / "agent_interaction" / "agent_config_local.yaml")
    output_dir: str | None = None  # None: outputs/run for a run, outputs/verify-<patch> for verification
    n: int = Field(1, ge=1)
    max_samples: int = -1
    max_turns: int | None = Field(None, ge=1)

    # Dask
    scheduler_address: str | None = None
    scheduler_file: str | None = None
    tls_dir: str | None = None  # credentials for a tls:// scheduler started apart (uni_agent.driver.tls); None: default
    # worker processes of the LocalCluster a run starts when given no scheduler; 0: one per 2 usable CPUs, 2 to 16
    local_workers: int = Field(0, ge=0)
    threads_per_worker: int = Field(2, ge=1)
    # AgentWorker actors, each running many rollouts as async loops on its dask worker's event loop; 0: one per
    # sandbox worker process (actors in one process share its loop, so more than one per process adds nothing)
    agent_workers: int = Field(0, ge=0)
    verify: bool = True
    worker_wait_timeout: float = Field(300, gt=0)

    # LLM engine
    engine: str = "llama_cpp"  # a name in uni_agent.engines.registry
    model_path: str | None = None
    model_name: str | None = None
    base_url: str | None = None
    api_key: SecretStr | None = None
    engine_replicas: int = Field(1, ge=1)  # llama_cpp on the CPUs: servers (on GPUs: engine_servers_per_gpu)
    # llama_cpp on GPUs: servers per GPU group, its slots (engine_parallel) split among them. Several beat one: a
    # server samples its slots one after another on one thread; 8 served best with the grammar and as well as any
    # without it (cluster/servers_per_gpu.py, README). Each holds its own copy of the weights: fewer for a large model.
    engine_servers_per_gpu: int = Field(8, ge=1)
    engine_threads: int | None = Field(None, ge=1)
    engine_device: Literal["auto", "cpu", "gpu"] = "auto"
    engine_parallel: int | None = Field(None, ge=1)
    engine_start_timeout: float = Field(300, gt=0)
    context_length: int = Field(8192, ge=1)
    temperature: float = Field(0.8, ge=0)
    top_p: float = Field(0.9, gt=0, le=1)
    max_tokens: int = Field(512, ge=1)
    llm_timeout: float = Field(600, gt=0)
    nnodes: int = Field(1, ge=1)
    n_gpus_per_node: int = Field(8, ge=1)
    tp: int = Field(1, ge=1)
    gpu_resource_name: str = "GPU"
    vllm_executable: str = "vllm"
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_model_len: int | None = Field(None, ge=1)
    tool_call_parser: str = "hermes"
    vllm_extra_args: list[str] = Field(default_factory=list)
    engine_restart_on_crash: bool = True
    engine_max_restarts: int = Field(3, ge=0)  # per replica within engine_restart_window; then the replica is down
    engine_restart_window: float = Field(3600, gt=0)
    engine_down_wait: float = Field(600, gt=0)  # how long a model call waits for a down engine before it fails
    engine_share_prompt: bool = True  # llama_cpp: read the agents' system prompt once per server, not once per slot

    # Output
    flush_every: int = Field(16, ge=1)
    write_retry_timeout: float = Field(600, gt=0)  # results that cannot be written: retried this long, then the run ends
    log_level: str = "INFO"
    progress: bool = True
    # The run's LocalCluster serves Dask's dashboard and the uni-agent page (behind a per-run token); false: neither
    dashboard: bool = True
    # outputs, logs and caches are private to you (0700/0600); true: your group may read them (0750/0640)
    share_with_group: bool = False
    retry_errors: bool = False  # a resumed run re-runs the rollouts whose failure_kind is infra, replacing their rows
    # Token-exact trajectories (uni_agent.llm.TOKEN_CAPTURE): auto = llama_server for llama_cpp, vllm for vllm, off for
    # an external endpoint (name its protocol to capture there)
    token_capture: Literal["auto", "off", "llama_server", "vllm"] = "auto"

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, name: str) -> str:
        return ENGINES.check(name)

    @field_validator("max_samples")
    @classmethod
    def _all_or_some(cls, value: int) -> int:
        if value == 0 or value < -1:  # 0 rows would be a run of nothing, reported as "no valid rows"
            raise ValueError("must be -1 (every row) or >= 1")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [
            _OldNames(settings_cls, init_settings, lambda old: f"keyword {old}"),
            env_settings, _OldEnvironment(settings_cls)]
        path = settings_file()
        if path is not None:
            yaml = YamlConfigSettingsSource(settings_cls, yaml_file=path)
            sources.append(_OldNames(settings_cls, yaml, lambda old: f"{path}: {old}"))
        return tuple(sources)

    def sampling(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}

    def api_key_value(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None

    def output_path(self, default: str = DEFAULT_RUN_OUTPUT_DIR) -> Path:
        """output_dir, or `default` when none was set, as an absolute path."""
        return Path(self.output_dir or default).expanduser().resolve()


class _OldNames(PydanticBaseSettingsSource):
    """A settings source with its old names (RENAMED) turned into the new ones, each with a FutureWarning; both names
    in one source is an error (which one was meant?)."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource,
                 where: Callable[[str], str]):
        super().__init__(settings_cls)
        self.inner, self.where = inner, where

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ gives the whole source at once

    def __call__(self) -> dict[str, Any]:
        values = dict(self.inner())
        for old, new in RENAMED.items():
            if old in values:
                if new in values:
                    raise ConfigError(f"{self.where(old)} and {new} both given: {old} is the old name of {new}; "
                                      f"keep {new}")
                warnings.warn(f"{self.where(old)} is the old name of {new}: use {new}", FutureWarning, stacklevel=2)
                values[new] = values.pop(old)
        return values


class _OldEnvironment(PydanticBaseSettingsSource):
    """UNI_AGENT_<old name> variables (RENAMED) as their new settings, below the new variables in precedence."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for old, new in RENAMED.items():
            given = [k for k in os.environ if k.upper() == env_name(old)]
            if not given:
                continue
            if any(k.upper() == env_name(new) for k in os.environ):
                raise ConfigError(f"{given[0]} and {env_name(new)} both set: {given[0]} is the old name; keep "
                                  f"{env_name(new)}")
            warnings.warn(f"{given[0]} is the old name of {env_name(new)}: use {env_name(new)}", FutureWarning,
                          stacklevel=2)
            values[new] = os.environ[given[0]]
        return values


def load_settings(base: RunSettings | None = None, *, flags: Mapping[str, str] | None = None,
                  **overrides: Any) -> RunSettings:
    """RunSettings from file, environment and `overrides`, checked before anything starts: a bad value or an unknown
    UNI_AGENT_* variable is a ConfigError naming where it came from. `flags` maps the fields given on the command
    line to their flag (`{"n": "--n"}`), so errors name the flag; other overrides are named as keyword arguments."""
    check_environment()
    if base is not None:
        overrides = {**base.model_dump(exclude_unset=True), **overrides}
    try:
        return RunSettings(**overrides)
    except ValidationError as exc:
        lines = [_explain(error, overrides, flags or {}) for error in exc.errors()]
        if len(lines) == 1:
            raise ConfigError(lines[0]) from None
        raise ConfigError("\n  ".join(["invalid run settings:", *lines])) from None


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """An unknown UNI_AGENT_* variable is an error naming the closest known one: a misspelled setting would otherwise
    be ignored without a word (UNI_AGENT_MAX_SAMPLE=1 would run every task)."""
    environ = os.environ if environ is None else environ
    settings = {env_name(field) for field in [*RunSettings.model_fields, *RENAMED]}
    known = settings | OTHER_VARIABLES
    unknown = sorted(k for k in environ if k.upper().startswith(ENV_PREFIX) and k.upper() not in known)
    if not unknown:
        return
    lines = []
    for name in unknown:
        # Compared without the common prefix, which would make every name look close.
        close = difflib.get_close_matches(name.upper().removeprefix(ENV_PREFIX),
                                          sorted(k.removeprefix(ENV_PREFIX) for k in known), n=1, cutoff=0.6)
        hint = (f"did you mean {ENV_PREFIX}{close[0]}?" if close else
                f"run settings are {ENV_PREFIX}<key> for the keys of {DEFAULT_SETTINGS_FILE.relative_to(REPO_ROOT)}")
        lines.append(f"unknown environment variable {name} ({hint})")
    raise ConfigError("\n".join(lines))


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _origin(field: str, overrides: Mapping[str, Any], flags: Mapping[str, str]) -> str:
    """Where the value of `field` came from, in the words the user wrote it: --flag, keyword, variable or file key.
    The order is the precedence order: overrides, then the environment, then the settings file. A setting given by its
    old name (RENAMED) is named by that name."""
    names = [field, *(old for old, new in RENAMED.items() if new == field)]
    for name in names:
        if name in overrides:
            return flags.get(name, name)
    for name in names:
        if any(k.upper() == env_name(name) for k in os.environ):
            return env_name(name)
    path = settings_file()
    if path is None:
        return field
    keys = _file_keys(path)
    return f"{path}: {next((name for name in names if name in keys), field)}"


def _file_keys(path: Path) -> set[str]:
    import yaml

    with contextlib.suppress(Exception):  # only for naming a key in an error message
        return set(yaml.safe_load(path.read_text()) or {})
    return set()


def _explain(error: Mapping[str, Any], overrides: Mapping[str, Any], flags: Mapping[str, str]) -> str:
    """One pydantic error as `<where> <problem> (got <value>)`, e.g. `--n must be >= 1 (got 0)`."""
    field = ".".join(map(str, error["loc"])) or "?"
    top = str(error["loc"][0]) if error["loc"] else field
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(top, list(RunSettings.model_fields), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"{_origin(top, overrides, flags)}: unknown setting{hint}"
    bounds = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"),
              "less_than": ("<", "lt")}
    if kind in bounds:
        sign, key = bounds[kind]
        problem = f"must be {sign} {ctx[key]:g}"
    else:
        problem = error["msg"].removeprefix("Value error, ").removeprefix("Input ")  # "Input should be ..."
        problem = problem[0].lower() + problem[1:] if problem else problem
    got = "" if top == "api_key" else f" (got {error.get('input')!r})"  # a secret is never echoed
    return f"{_origin(top, overrides, flags)} {problem}{got}"
