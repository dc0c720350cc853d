"""update_weights: every engine replica switches to new weights, one replica at a time, without losing a rollout.

For each replica, the agent workers first pause it (new calls to it wait; calls in flight get up to `drain_timeout`
seconds to end), then the engine switches, then the workers resume it stamping the new version on every token it
samples from then on. A rollout keeps its replica throughout (sticky routing: its calls wait, they do not move), and
a call the switch cut off is made again on the new weights. Other replicas keep serving meanwhile, so with several
replicas a rollout never waits for more than its own replica's switch.

    llama_cpp   a restart of the replica's llama-server on the new GGUF, on its port (ServerActor.restart, the same
                restart that brings a crashed server back). Without preflight (the default) a file that does not
                load is noticed by the restart, which starts the old model again; with it, the new file is first
                loaded on a spare port (within the replica's pause) and the old server is never stopped for it
    vllm        no restart: the runtime endpoints of the running server. An adapter (lora=True) is loaded with
                POST /v1/load_lora_adapter {lora_name, lora_path} (the server started with --enable-lora and
                VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) and the calls then name it as their model. Full weights are
                reloaded from a directory with POST /collective_rpc {"method": "reload_weights", ...} (the server
                started with VLLM_SERVER_DEV_MODE=1), then POST /reset_prefix_cache. Tested against a stand-in only.
    external    nothing is started or restarted: the version is the served model name the calls use from now on.

A switch that fails leaves the previous version serving: the failed replica is back on its old weights (or never
left them), replicas already switched are switched back, and the error says what failed and what serves.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog

log = structlog.get_logger("uni_agent.online")


class UpdateFailed(RuntimeError):
    """The new weights are not served; the message names the replica, the cause and the version serving instead."""


@dataclass
class ReplicaSwitch:
    url: str
    paused_s: float = 0.0  # from the pause to the resume: how long this replica took no new calls
    drain_left: int = 0  # calls still in flight when the drain gave up (cut off by the switch and made again)


@dataclass
class UpdateReport:
    version: int
    path: str | None
    seconds: float = 0.0  # from the call to every replica serving the new version
    replicas: list[ReplicaSwitch] = field(default_factory=list)

    @property
    def max_pause_s(self) -> float:
        return max((r.paused_s for r in self.replicas), default=0.0)


async def switch_replica(pool: Any, url: str, version: int, model: str | None, drain_timeout: float,
                         switch: Callable[[], Awaitable[None]]) -> ReplicaSwitch:
    """Pause `url` on every agent worker, run `switch`, resume it on `version` (on what it served before, when the
    switch failed: the switch leaves the old weights serving then)."""
    record = ReplicaSwitch(url)
    started = time.monotonic()
    pool.switching.add(url)  # before the pause: an agent worker started from now on pauses it too
    try:
        left = await pool.broadcast("pause_replica", url, drain_timeout)
        record.drain_left = sum(x or 0 for x in left)
        await switch()
    except BaseException:
        pool.served(url, pool.versions[url], pool.models[url])  # what served before serves on
        await pool.broadcast("resume_replica", url, pool.versions[url], pool.models[url])
        raise
    pool.served(url, version, model)
    await pool.broadcast("resume_replica", url, version, model)
    record.paused_s = time.monotonic() - started
    return record


async def llama_restart(server: Any, path: str, timeout: float, preflight: bool) -> None:
    """A replica's llama-server on `path` (ServerActor.restart keeps the old model serving when the new fails)."""
    await server.restart(path, timeout=timeout, drain_timeout=0.0, preflight=preflight)


async def vllm_switch(url: str, path: str, *, lora_name: str | None, api_key: str | None, timeout: float) -> None:
    """vLLM's runtime endpoints: an adapter loaded under `lora_name`, or full weights reloaded from `path`."""
    root = url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=timeout, headers=headers) as http:
        if lora_name is not None:
            calls = [("/v1/load_lora_adapter", {"lora_name": lora_name, "lora_path": path})]
        else:
            calls = [("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}}),
                     ("/reset_prefix_cache", None)]
        for route, body in calls:
            try:
                answer = await http.post(root + route, json=body)
            except httpx.HTTPError as exc:
                raise UpdateFailed(f"{root}{route}: {type(exc).__name__}: {exc}") from exc
            if answer.status_code >= 400:
                raise UpdateFailed(f"{root}{route} answered HTTP {answer.status_code}: {answer.text[:500]}")


async def update_engines(engine: str, engines: Any, pool: Any, *, version: int, old_version: int, path: str | None,
                         old_path: str | None, model_name: str | None, lora: bool, drain_timeout: float,
                         preflight: bool, timeout: float) -> UpdateReport:
    """Switch every replica of `engines` to `version`, one at a time (see the module doc)."""
    report = UpdateReport(version, path)
    started = time.monotonic()
    if engine == "external":
        if not model_name:
            raise ValueError("update_weights on an external endpoint needs model_name: the served model name that is "
                             "the new version (the endpoint loads it; nothing is restarted here)")
        for url in engines.urls:  # no pause: a call carries its model name from the start, and its version with it
            pool.served(url, version, model_name)
            await pool.broadcast("resume_replica", url, version, model_name)
            report.replicas.append(ReplicaSwitch(url))
        report.seconds = time.monotonic() - started
        return report
    if path is None:
        raise ValueError(f"update_weights on engine {engine} needs a path (the new weights)")
    if engine == "llama_cpp" and lora:
        raise ValueError("llama_cpp: LoRA adapters are not switched at run time here; merge the adapter into a GGUF "
                         "(llama.cpp's export-lora) and pass that file")
    lora_name = (model_name or f"{engines.model_name}-v{version}") if lora else None
    old_models = dict(pool.models)
    done: list[tuple[Any, str]] = []
    for server, url in zip(engines.actors, engines.urls, strict=True):
        if engine == "llama_cpp":
            switch = lambda server=server: llama_restart(server, path, timeout, preflight)  # noqa: E731
        elif engine == "vllm":
            switch = lambda url=url: vllm_switch(url, path, lora_name=lora_name,  # noqa: E731
                                                 api_key=engines.api_key, timeout=timeout)
        else:
            raise ValueError(f"update_weights: engine {engine} has no way to change its weights")
        try:
            report.replicas.append(await switch_replica(pool, url, version, lora_name or old_models[url],
                                                        drain_timeout, switch))
        except Exception as exc:
            undone = await _roll_back(engine, pool, done, old_version, old_path, old_models, timeout,
                                      reload=not lora, api_key=engines.api_key)
            serving = f"version {old_version}" + (f" ({old_path})" if old_path else "")
            raise UpdateFailed(
                f"update to version {version} ({path}) failed on {url}: {type(exc).__name__}: {str(exc)[:3000]}; "
                + (f"{serving} serves on every replica" if not undone else
                   f"and switching back failed on {', '.join(undone)}: those replicas may serve neither")) from exc
        done.append((server, url))
    report.seconds = time.monotonic() - started
    log.info("weights_updated", version=version, path=path, seconds=round(report.seconds, 3),
             max_pause_s=round(report.max_pause_s, 3))
    return report


async def _roll_back(engine: str, pool: Any, done: list[tuple[Any, str]], old_version: int, old_path: str | None,
                     old_models: dict[str, str | None], timeout: float, *, reload: bool, api_key: str | None
                     ) -> list[str]:
    """Replicas already switched go back to the old weights (newest first); returns those that could not."""
    failed = []
    for server, url in reversed(done):
        if engine == "llama_cpp" and old_path is not None:
            switch = lambda server=server: llama_restart(server, old_path, timeout, False)  # noqa: E731
        elif engine == "vllm" and reload and old_path is not None:  # full weights: reload the old ones
            switch = lambda url=url: vllm_switch(url, old_path, lora_name=None, api_key=api_key,  # noqa: E731
                                                 timeout=timeout)
        else:  # an adapter: it was only added; calls name the old model again

            async def switch() -> None:
                return None
        try:
            await switch_replica(pool, url, old_version, old_models[url], 0.0, switch)
        except Exception as exc:  # noqa: BLE001 - said in the UpdateFailed message
            failed.append(f"{url} ({type(exc).__name__}: {exc})")
    return failed
