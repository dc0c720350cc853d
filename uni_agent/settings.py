"""Run settings: defaults in settings/default.yaml, overridden by UNI_AGENT_* environment variables, then by CLI
flags (passed as keyword arguments)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from .config import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SETTINGS_FILE = REPO_ROOT / "settings" / "default.yaml"


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
    output_dir: str = "outputs/run"
    n: int = 1
    max_samples: int = -1
    max_turns: int | None = None

    # Dask
    scheduler_address: str | None = None
    scheduler_file: str | None = None
    n_workers: int = 2
    threads_per_worker: int = 2
    num_workers: int = 2
    verify: bool = True
    worker_wait_timeout: float = 300

    # LLM engine
    engine: Literal["llama_cpp", "external", "vllm"] = "llama_cpp"
    model_path: str | None = None
    model_name: str | None = None
    base_url: str | None = None
    api_key: SecretStr | None = None
    engine_replicas: int = 1
    engine_threads: int | None = None
    engine_device: Literal["auto", "cpu", "gpu"] = "auto"
    engine_parallel: int | None = Field(None, ge=1)
    engine_start_timeout: float = 300
    context_length: int = 8192
    temperature: float = 0.8
    top_p: float = 0.9
    max_tokens: int = 512
    llm_timeout: float = 600
    nnodes: int = 1
    n_gpus_per_node: int = 8
    tp: int = 1
    gpu_resource_name: str = "GPU"
    vllm_executable: str = "vllm"
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_model_len: int | None = None
    tool_call_parser: str = "hermes"
    vllm_extra_args: list[str] = Field(default_factory=list)
    engine_restart_on_crash: bool = False
    engine_max_restarts: int = 3

    # Output
    flush_every: int = 16
    log_level: str = "INFO"
    progress: bool = True
    retry_errors: bool = False  # a resumed run re-runs the rollouts whose failure_kind is infra, replacing their rows
    # Token-exact trajectories (uni_agent.llm.TOKEN_CAPTURE): auto = llama_server for llama_cpp, vllm for vllm, off for
    # an external endpoint (name its protocol to capture there)
    token_capture: Literal["auto", "off", "llama_server", "vllm"] = "auto"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = settings_file()
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    def sampling(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}

    def api_key_value(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None


def load_settings(base: RunSettings | None = None, **overrides: Any) -> RunSettings:
    """RunSettings from file, environment and `overrides`; a bad value is a ConfigError naming where it came from."""
    if base is not None:
        overrides = {**base.model_dump(exclude_unset=True), **overrides}
    try:
        return RunSettings(**overrides)
    except ValidationError as exc:
        lines = [f"invalid run settings (from CLI flags, UNI_AGENT_* variables or {settings_file()}):"]
        lines += [f"  {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from None
