"""run.json, the run manifest: what produced a run's results, so that a trajectory can be traced to its inputs.

It holds the resolved settings (secrets masked), the agent configs as loaded, the hash of every rollout's merged
config (the configs themselves, one line per row, in configs.jsonl beside it), the package version and git commit,
the versions of Python, dask, distributed, pyarrow and the engine, the model file's sha256, the dataset's path and
sha256, and the start and end time of every session that wrote into the directory. A resumed run compares itself
with the first session and warns, naming each field that differs: results written under other settings are not
comparable.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from ..private_dirs import cache_dir
from typing import Any

import structlog

from ..redact import redact
from ..settings import REPO_ROOT, RunSettings

log = structlog.get_logger("uni_agent.manifest")

# Settings that do not change what a rollout produces: a resumed run may change them without a warning.
NOT_COMPARED = {"output_dir", "progress", "log_level", "scheduler_address", "scheduler_file", "tls_dir", "retry_errors",
                "flush_every", "worker_wait_timeout", "engine_start_timeout", "local_workers", "threads_per_worker",
                "agent_workers", "n_workers", "num_workers", "max_samples", "api_key",  # n_/num_workers: in older run.json
                "engine_restart_on_crash", "engine_max_restarts", "engine_restart_window", "engine_down_wait",
                "write_retry_timeout"}  # how faults are survived, not what a rollout produces
PACKAGES = ("uni-agent", "dask", "distributed", "pyarrow", "pandas", "httpx", "llama-cpp-python", "vllm")
HASH_CACHE = cache_dir() / "file-hashes.json"


class RunManifest:
    def __init__(self, output_dir: Path, data: dict[str, Any]):
        self.path = output_dir / "run.json"
        self.data = data

    @classmethod
    def begin(cls, output_dir: Path, run_id: str, settings: RunSettings, agents: Any, source: str,
              rows: list[dict[str, Any]], specs: list[Any]) -> RunManifest:
        """Record this session's inputs; on a resumed run, warn about every compared field that changed."""
        previous = _read(output_dir / "run.json")
        configs = _write_configs(output_dir, specs, len(previous.get("sessions") or []))
        current = {
            "settings": {k: v for k, v in settings.model_dump(mode="json").items()},
            "agents": agents.entries,  # as loaded, with the run settings that reach every agent
            "rollout_configs": configs,
            "dataset": dataset_info(source, rows),
            "model": model_info(settings),
        }
        session = {"started_at": _now(), "finished_at": None, "versions": versions(), "git": git_info(),
                   "host": platform.node(), "python": sys.version.split()[0],
                   "argv": [redact(arg) for arg in sys.argv]}  # a key given as --api-key is masked
        data = previous if previous.get("settings") else {"run_id": run_id, **current, "sessions": []}
        data["run_id"] = run_id
        if previous.get("settings"):
            session["differs"] = differences(previous, current)
            if session["differs"]:
                message = (f"warning: {output_dir} was started with other inputs; this resumed run differs in: "
                           + ", ".join(session["differs"]))
                print(message, file=sys.stderr)
                log.warning("resumed_run_differs", fields=session["differs"])
            session["inputs"] = current  # what this session ran with; the top level keeps the first session's
        data.setdefault("sessions", []).append(session)
        manifest = cls(output_dir, data)
        manifest.save()
        return manifest

    def note(self, **fields: Any) -> None:
        """Add facts learned during the run (engine versions, the token capture mode) to this session."""
        self.data["sessions"][-1].update(fields)
        self.save()

    def finish(self, summary: dict[str, Any]) -> None:
        session = self.data["sessions"][-1]
        session["finished_at"] = _now()
        session["num_rollouts"] = summary.get("num_rollouts")
        session["infra_failures"] = summary.get("infra_failures")
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(".run.json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def differences(previous: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted names of the compared fields whose values differ between two manifests."""
    out: list[str] = []
    for section in ("settings", "agents", "rollout_configs", "dataset", "model"):
        before, after = previous.get(section) or {}, current.get(section) or {}
        if section == "settings":
            before = {k: v for k, v in before.items() if k not in NOT_COMPARED}
            after = {k: v for k, v in after.items() if k not in NOT_COMPARED}
        if section in ("dataset", "rollout_configs", "model"):  # the same bytes at another path are the same input
            before, after = {"sha256": before.get("sha256")}, {"sha256": after.get("sha256")}
        out += _diff(before, after, section)
    return out


def _diff(a: Any, b: Any, where: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for key in sorted(set(a) | set(b), key=str) for d in _diff(a.get(key), b.get(key), f"{where}.{key}")]
    return [] if a == b else [where]


def dataset_info(source: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    path = Path(source)
    if path.is_file():
        return {"path": str(path.resolve()), "sha256": file_sha256(path), "rows": len(rows)}
    text = json.dumps(rows, sort_keys=True, default=str)  # rows passed in from Python
    return {"path": source, "sha256": hashlib.sha256(text.encode()).hexdigest(), "rows": len(rows)}


def model_info(settings: RunSettings) -> dict[str, Any]:
    """The model's file and sha256 where the driver can read it (a GGUF; a local model directory by its files)."""
    info: dict[str, Any] = {"engine": settings.engine, "model_name": settings.model_name, "path": settings.model_path}
    path_text = settings.model_path
    if path_text is None and settings.engine == "llama_cpp":
        with contextlib.suppress(Exception):
            from ..engines.llama_cpp import default_model_path

            path_text = default_model_path()
    if path_text is None:
        return info
    path = Path(path_text).expanduser()
    info["path"] = str(path)
    if path.is_file():
        info["sha256"] = file_sha256(path)
    elif path.is_dir():  # a Hugging Face model directory: every file's name and sha256
        digest = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(path)}\0{file_sha256(file)}\n".encode())
        info["sha256"] = digest.hexdigest()
        info["sha256_of"] = "the directory's files (name and sha256 of each)"
    else:
        info["sha256"] = None
        info["sha256_of"] = "not a file on the driver (a hub id, or a path on the GPU nodes)"
    return info


def file_sha256(path: Path) -> str:
    """sha256 of a file, cached by path, size and mtime (a GGUF of gigabytes is hashed once)."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    cache = _read(HASH_CACHE)
    if key in cache:
        return cache[key]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if stat.st_size >= 1 << 24:  # only big files are worth remembering
        with contextlib.suppress(OSError):
            HASH_CACHE.parent.mkdir(parents=True, exist_ok=True)
            cache[key] = digest.hexdigest()
            tmp = HASH_CACHE.with_name(f".{HASH_CACHE.name}.{os.getpid()}")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, HASH_CACHE)
    return digest.hexdigest()


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    with contextlib.suppress(ImportError):  # llama-server reports no version of its own (built from an sdist)
        from ..engines.llama_build import SOURCE_PACKAGE, SOURCE_VERSION

        found["llama-server"] = f"built from the llama.cpp vendored in {SOURCE_PACKAGE} {SOURCE_VERSION}"
    return found


def git_info() -> dict[str, Any]:
    """The commit of the checkout the package runs from, and whether it had uncommitted changes."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


async def engine_versions(urls: list[str], api_key: str | None = None) -> list[dict[str, Any]]:
    """What each engine says it is: vLLM's GET /version, llama-server's GET /props (build_info); best effort. On
    aiohttp, which the driver has loaded already (httpx would import its transport at the run's start)."""
    import asyncio

    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    found = []
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as http:
        for url in urls:
            root, entry = url.rstrip("/").removesuffix("/v1"), {"url": url}
            for path, pick in (("/version", "version"), ("/props", "build_info")):
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError, TypeError):
                    async with http.get(root + path) as response:
                        body = json.loads(await response.text()) if response.status == 200 else {}
                    if pick in body:
                        entry[pick] = body[pick]
            found.append(entry)
    return found


def _write_configs(output_dir: Path, specs: list[Any], session: int) -> dict[str, Any]:
    """Every row's merged agent config, one JSON line per instance, in configs.jsonl (a resumed session whose configs
    differ writes configs.session-N.jsonl instead); returns the file, the count and the sha256 of its text."""
    lines, seen = [], set()
    dumped: dict[int, str] = {}  # id(agent config) -> its JSON: rows without tools_kwargs share one config object
    for spec in specs:
        if spec.instance_id in seen:  # the n rollouts of a row share its config
            continue
        seen.add(spec.instance_id)
        config = dumped.get(id(spec.agent))
        if config is None:
            config = dumped[id(spec.agent)] = json.dumps(spec.agent.model_dump(mode="json", by_alias=True),
                                                         sort_keys=True)
        # what json.dumps({"instance_id": ..., "agent": config}, sort_keys=True) writes, the config dumped once
        lines.append(f'{{"agent": {config}, "instance_id": {json.dumps(spec.instance_id)}}}')
    text = "\n".join(lines) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()
    path = output_dir / "configs.jsonl"
    if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        path = output_dir / f"configs.session-{session}.jsonl"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return {"file": path.name, "count": len(lines), "sha256": digest}


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
