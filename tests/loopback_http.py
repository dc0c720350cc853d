"""An aiohttp app served on a free loopback port for as long as a test needs it: the stand-in endpoints that tests
script (what they answer, what they were asked)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 and yield its base URL (http://127.0.0.1:PORT/v1); stopped on exit."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()
