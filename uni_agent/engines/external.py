"""An endpoint the user already runs: nothing is started; it is checked once so a wrong URL fails fast."""

from __future__ import annotations

from typing import Any

from ..llm import LLMError, check_endpoint
from ..settings import RunSettings
from .base import Engines


async def external_engines(client: Any, settings: RunSettings, log_dir: str) -> Engines:
    if not settings.base_url:
        raise LLMError("--engine external needs --base-url (e.g. http://localhost:8000/v1)")
    models = await check_endpoint(settings.base_url, settings.api_key_value())
    model = settings.model_name or (models[0] if len(models) == 1 else None)
    if model is None:
        raise LLMError(f"{settings.base_url} serves {models or 'no listed models'}; choose one with --model")
    return Engines(urls=[settings.base_url.rstrip("/")], model_name=model, api_key=settings.api_key_value())
