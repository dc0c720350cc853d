"""Reading the agents' shared prompt once per llama-server instead of once per slot.

Every rollout's first request starts with the same system prompt (with the tools, ~1,200 tokens for the example
agent). A slot only reuses tokens that it has itself cached, so at the first wave each of a server's slots read that
prompt again, all at once, while the rollouts waited. Before the first wave, `share_prompt` has each server read one
opening request into slot 0 and copies that slot's KV cache into every other slot (llama-server's slot save and
restore, a few ms each, through the directory given by --slot-save-path). A first-wave request then goes to a slot
whose cached prefix it shares and reads only its own task's tokens.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import structlog

log = structlog.get_logger("uni_agent.engines.shared_prompt")

SLOT_FILE = "shared-prompt.bin"  # in the server's --slot-save-path directory


async def share_prompt(urls: list[str], model: str, messages: list[dict[str, Any]], tools: list[dict] | None,
                       *, api_key: str | None = None, timeout: float = 600) -> list[dict[str, Any]]:
    """Cache `messages` (and `tools`) in every slot of every server at `urls` (…/v1); returns, per server, its slot
    count, the tokens read and the seconds it took. A server that cannot (an older build, no --slot-save-path)
    raises httpx.HTTPError: the run goes on without the sharing, which only saves time."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    shared = []
    async with httpx.AsyncClient(timeout=timeout, headers=headers) as http:
        for url in urls:
            base, started = url.removesuffix("/v1"), time.monotonic()
            slots = int((await _ok(http.get(f"{base}/props")))["total_slots"])
            body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 1, "id_slot": 0}
            if tools:
                body["tools"] = tools
            read = await _ok(http.post(f"{url}/chat/completions", json=body))
            await _ok(http.post(f"{base}/slots/0?action=save", json={"filename": SLOT_FILE}))
            for slot in range(1, slots):
                await _ok(http.post(f"{base}/slots/{slot}?action=restore", json={"filename": SLOT_FILE}))
            figures = {"url": url, "slots": slots, "prompt_tokens": read.get("usage", {}).get("prompt_tokens"),
                       "seconds": round(time.monotonic() - started, 3)}
            log.info("prompt_shared", **figures)
            shared.append(figures)
    return shared


async def _ok(request: Any) -> dict[str, Any]:
    response = await request
    response.raise_for_status()
    return response.json()
