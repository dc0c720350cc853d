"""One Terminal-Bench 2 task folder, read and validated.

    task.toml               [agent] timeout_sec, [verifier] timeout_sec and env, [solution] env,
                            [environment] build_timeout_sec, docker_image, cpus, memory_mb (or memory = "2G"),
                            allow_internet, gpus, env
    instruction.md          the task, given to the agent as its prompt
    environment/Dockerfile  the machine the agent works in (its last WORKDIR is the task's workdir)
    tests/test.sh           the verifier: writes /logs/verifier/reward.txt (a number) or reward.json
    solution/solve.sh       the oracle's solution

Timeouts default to 600 s as in Terminal-Bench. Keys this system does not use (e.g. [metadata], storage_mb,
mcp_servers) are accepted and listed in `LoadedTask.unused_keys`, so a converter can say what it ignored.
"""

from __future__ import annotations

import base64
import gzip
import io
import re
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..config import ConfigError
from .dockerfile import DockerfileInfo, parse_dockerfile

DEFAULT_TIMEOUT_S = 600.0
USED_KEYS = {
    "agent": {"timeout_sec"},
    "verifier": {"timeout_sec", "env"},
    "solution": {"env"},
    "environment": {"build_timeout_sec", "docker_image", "cpus", "memory_mb", "memory", "allow_internet", "gpus",
                    "env"},
}
IGNORED_TOP_LEVEL = {"version", "schema_version", "metadata", "task"}  # descriptive only


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")


def _env_map(value: dict[str, Any]) -> dict[str, str]:
    bad = [k for k in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    if bad:
        raise ValueError(f"not valid environment variable names: {bad}")
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


EnvMap = Annotated[dict[str, str | int | float | bool], AfterValidator(_env_map)]


class AgentSection(_Section):
    timeout_sec: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)


class VerifierSection(_Section):
    timeout_sec: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    env: EnvMap = Field(default_factory=dict)


class SolutionSection(_Section):
    env: EnvMap = Field(default_factory=dict)


class EnvironmentSection(_Section):
    build_timeout_sec: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    docker_image: str | None = None
    """A prebuilt image to run instead of building environment/Dockerfile."""
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, ge=16)
    memory: str | None = None
    """The older form, e.g. "2G" or "512M"; memory_mb wins when both are given."""
    allow_internet: bool = True
    gpus: int = Field(default=0, ge=0)
    env: EnvMap = Field(default_factory=dict)

    @field_validator("memory")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d+(\.\d+)?\s*[KMGT]?i?B?", value.strip(), re.I):
            raise ValueError(f"not a memory size like '2G' or '512M': {value!r}")
        return value

    def memory_limit_mb(self) -> int | None:
        if self.memory_mb is not None:
            return self.memory_mb
        if self.memory is None:
            return None
        number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)", self.memory.strip().upper().rstrip("IB")).groups()
        scale = {"": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
        return max(1, int(float(number) * scale))


class TaskToml(_Section):
    agent: AgentSection = Field(default_factory=AgentSection)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)


@dataclass
class LoadedTask:
    task_id: str  # the folder's name, as Terminal-Bench names its tasks
    folder: Path
    config: TaskToml
    toml_text: str
    instruction: str
    dockerfile: DockerfileInfo
    tests_archive: bytes  # tar.gz of tests/, unpacked at /tests only when verifying
    solution_archive: bytes | None  # tar.gz of solution/, for the oracle
    unused_keys: list[str]

    @property
    def workdir(self) -> str:
        assert self.dockerfile.workdir is not None
        return self.dockerfile.workdir


def pack_dir(directory: Path) -> bytes:
    """A deterministic tar.gz of a directory's contents (sorted, owner root, mtime 0), so a row's bytes depend only on
    the files, and an unchanged task converts to the same row."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
        for path in sorted(directory.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(directory).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if path.is_file() and not path.is_symlink():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unused_keys(raw: dict[str, Any]) -> list[str]:
    unused = []
    for key, value in raw.items():
        if key in IGNORED_TOP_LEVEL:
            continue
        if key not in USED_KEYS:
            unused.append(key)
        elif isinstance(value, dict):
            unused.extend(f"{key}.{sub}" for sub in value if sub not in USED_KEYS[key])
    return sorted(unused)


def _field_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors())


def load_task(folder: Path) -> LoadedTask:
    """Read one task folder; a ConfigError names the folder and what is wrong (file, field)."""
    folder = folder.resolve()
    name = folder.name
    toml_path = folder / "task.toml"
    try:
        toml_text = toml_path.read_text()
        raw = tomllib.loads(toml_text)
    except FileNotFoundError:
        raise ConfigError(f"task {name}: no task.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"task {name}: task.toml is not valid TOML: {exc}") from None
    try:
        config = TaskToml.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"task {name}: task.toml: {_field_errors(exc)}") from None
    instruction_path = folder / "instruction.md"
    if not instruction_path.is_file():
        raise ConfigError(f"task {name}: no instruction.md (the task given to the agent)")
    instruction = instruction_path.read_text().strip()
    if not instruction:
        raise ConfigError(f"task {name}: instruction.md is empty")
    try:
        dockerfile = parse_dockerfile(folder / "environment" / "Dockerfile")
    except ConfigError as exc:
        raise ConfigError(f"task {name}: {exc}") from None
    if not (folder / "tests" / "test.sh").is_file():
        raise ConfigError(f"task {name}: no tests/test.sh (the verifier that writes /logs/verifier/reward.txt)")
    solution = folder / "solution"
    solution_archive = pack_dir(solution) if (solution / "solve.sh").is_file() else None
    return LoadedTask(name, folder, config, toml_text, instruction, dockerfile, pack_dir(folder / "tests"),
                      solution_archive, _unused_keys(raw))


def task_folders(tasks_dir: Path) -> list[Path]:
    """Every sub-folder holding a task.toml, or anything else that looks like a task (so a broken one is reported,
    not skipped in silence): a folder with instruction.md, environment/ or tests/."""
    if not tasks_dir.is_dir():
        raise ConfigError(f"{tasks_dir}: not a directory of Terminal-Bench task folders")
    markers = ("task.toml", "instruction.md", "environment", "tests")
    folders = sorted(p for p in tasks_dir.iterdir() if p.is_dir() and any((p / m).exists() for m in markers))
    if not folders:
        raise ConfigError(f"{tasks_dir}: no task folders (each holds task.toml, instruction.md, environment/, tests/)")
    return folders
