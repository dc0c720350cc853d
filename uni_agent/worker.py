"""The agent worker: a lightweight Dask actor that runs many rollouts as async loops on its worker's event loop.

Nothing here blocks: sandboxes are asyncio subprocesses and the LLM client is async. The driver decides how many
rollouts each worker runs at once; this class picks the least-loaded engine replica for each new rollout, and the
rollout keeps that replica for all its turns (one client per rollout call), which keeps the server's prefix cache warm.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from .llm import ChatClient
from .logs import configure_logging
from .redact import register_secret
from .rollout import RolloutResult, RolloutSpec


class AgentWorker:
    def __init__(self, urls: list[str], model: str, api_key: str | None, sampling: dict[str, Any],
                 llm_timeout: float, log_dir: str, log_level: str = "INFO"):
        if not urls:
            raise ValueError("AgentWorker needs at least one engine URL")
        register_secret(api_key)
        configure_logging(log_dir, "agent-worker", log_level)
        self.urls = list(urls)
        self.clients = {url: ChatClient(url, model, api_key, timeout=llm_timeout, sampling=sampling) for url in urls}
        self.load = {url: 0 for url in urls}
        self.in_flight = 0
        self.address = _worker_address()

    async def run_rollout(self, spec: RolloutSpec) -> RolloutResult:
        url = min(self.urls, key=self.load.__getitem__)
        self.load[url] += 1
        self.in_flight += 1
        try:
            loop_class = _import(spec.agent.target)
            result: RolloutResult = await loop_class(spec.agent, self.clients[url]).run(spec, worker=self.address)
        finally:
            self.load[url] -= 1
            self.in_flight -= 1
        if spec.agent.log_dir:
            _save_trajectory(spec.agent.log_dir, result)
        return result

    async def close(self) -> None:
        for client in self.clients.values():
            await client.aclose()


def _import(target: str) -> Any:
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except ValueError:
        return "local"


def _save_trajectory(log_dir: str, result: RolloutResult) -> None:
    # One readable file per rollout, named by instance and rollout index (not by an opaque run uuid).
    path = Path(log_dir).expanduser() / result.run_id / f"{result.instance_id}__r{result.rollout}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    row = result.row()
    row["messages"] = json.loads(row["messages"])
    path.write_text(json.dumps(row, indent=1, ensure_ascii=False))
