"""An endpoint the user already runs: nothing is started; it is checked once so a wrong URL fails fast.

Several replicas of one model (each its own URL, `--base-url URL1,URL2`): every agent worker's rollouts spread over
them, each rollout keeping the least-loaded one for all its turns (episode/worker.py, Router). They are also what
lets one host hold more connections than one address and port takes well: each holds a local port of the kernel's
ephemeral range (28,232 by default, shared by every process on the host), and past half of it (about 14,000) every
new connection costs connect() a search of the whole odd half, ~1 ms of CPU instead of ~20 us
(python -m uni_agent.bench.connect_cost)."""

from __future__ import annotations

import asyncio
from typing import Any

from ..llm import LLMError, check_endpoint
from ..settings import RunSettings
from .base import Engines


def replica_urls(base_url: str) -> list[str]:
    """`--base-url` as its replicas' URLs (comma-separated; empty items and trailing slashes dropped)."""
    return [url.strip().rstrip("/") for url in base_url.split(",") if url.strip()]


async def external_engines(client: Any, settings: RunSettings, log_dir: str) -> Engines:
    urls = replica_urls(settings.base_url or "")
    if not urls:
        raise LLMError("--engine external needs --base-url (e.g. http://localhost:8000/v1)")
    served = await asyncio.gather(*(check_endpoint(url, settings.api_key_value()) for url in urls))
    models = served[0]
    model = settings.model_name or (models[0] if len(models) == 1 else None)
    if model is None:
        raise LLMError(f"{urls[0]} serves {models or 'no listed models'}; choose one with --model")
    for url, listed in zip(urls, served, strict=True):
        if listed and model not in listed:  # an endpoint that lists nothing is taken at its word
            raise LLMError(f"{url} does not serve {model!r} (it serves {listed}): every --base-url replica must "
                           "serve the same model")
    return Engines(urls=urls, model_name=model, api_key=settings.api_key_value())
