"""The model gateway: an OpenAI-compatible HTTP server per agent worker, for programs that bring their own agent loop.

Every harness rollout on the worker registers a Lease and gets a token of its own; its program reaches the gateway
through its sandbox's relay (Session.listen: the sandbox's network stays off) with OPENAI_API_KEY set to that token,
never the run's real key. Each call is matched to its rollout by the token and forwarded through that rollout's own
model (the worker's RolloutSession: retries, replica routing and failover, token capture), one call of a rollout at a
time (its calls are one sequence). What the gateway does on the way:
- budgets: the rollout's model calls (max_calls), its wall clock and the engine's context window. A call past one of
  them is answered with an error the program sees (HTTP 403 `budget_exceeded`, or 400 `context_length_exceeded`,
  which OpenAI clients and litellm do not retry) and ends the episode (the agent then stops the program);
- function calling: `tools` go to the engine as they are (interaction.tools_in: api), or are described in the prompt
  and parsed back from the model's text with our parsers (tools_in: prompt, translate.py);
- token truth: each call's tokens and the chain it continues are recorded in the rollout's CallLog (calls.py);
- `stream: true` is answered as server-sent events (the whole reply once it is complete: its tokens are recorded first).
The program's sampling fields (temperature, max_tokens, ...) and `model` are ignored: the run's settings apply to every
agent alike. Endpoints: POST /v1/chat/completions, GET /v1/models (also without /v1).

Each rollout gets a door of its own: a Unix socket in the gateway's private directory (mode 0700, made inside the
user's private scratch, uni_agent.private_dirs.private_tmp: no other local user can connect, nor plant or swap a socket
there) that its sandbox's relay connects to, and that answers its token only, so that a token could not reach
another rollout's session even if it got out of its sandbox. (The benchmark's direct comparison listens on 127.0.0.1,
where every call still needs a rollout's token.)
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import os
import secrets
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web

from ..episode.ending import Ending, infra_failure
from ..episode.exit_reason import ExitReason
from ..episode.failures import FailedPart
from ..llm import ChatReply, ContextLimitError, LLMError
from ..private_dirs import private_tmp
from ..sandbox.relay import Connect, tcp_target, unix_target
from ..tool_calls import decoding_schema
from .calls import CallLog
from .translate import PromptTools

log = structlog.get_logger("uni_agent.harness")


class Lease:
    """What the gateway knows of one rollout: its model, budgets, the calls so far, and how its episode ended."""

    def __init__(self, model: Any, model_name: str, *, max_calls: int, deadline: float | None,
                 tools_in: str = "api", tool_parser: str = "hermes", constrain_tool_calls: bool = False,
                 name: str = ""):
        self.token = "ua-" + secrets.token_urlsafe(32)
        self.model, self.model_name, self.name = model, model_name, name
        self.max_calls, self.deadline = max_calls, deadline
        self.prompt_tools = PromptTools(tool_parser) if tools_in == "prompt" else None
        self.constrain_tool_calls = constrain_tool_calls  # every reply one valid call (interaction.constrain_...)
        self.calls = CallLog()
        self.lock = asyncio.Lock()
        self.ended = asyncio.Event()
        self.ending: Ending | None = None  # how the gateway ended the episode, when it did (a budget, a failure)
        self.refused = 0  # calls answered with an error
        self.on_call: Callable[[int], None] = lambda calls: None  # after each answered call (the agent's progress)

    def finish(self, ending: Ending) -> None:
        """End the episode (the first ending stands)."""
        if self.ending is None:
            self.ending = ending
            self.ended.set()


class Gateway:
    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}
        self.socket_dir: str | None = None
        self.port: int | None = None
        self._doors: dict[str, Lease] = {}  # a rollout's socket path -> its lease
        self._sites: dict[str, web.UnixSite] = {}
        self._door_ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        app = web.Application(client_max_size=64 << 20)
        for prefix in ("/v1", ""):
            app.router.add_post(prefix + "/chat/completions", self._chat)
            app.router.add_get(prefix + "/models", self._models)
        self._app = app

    async def start(self, tcp: bool = False) -> Gateway:
        self._runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await self._runner.setup()
        if tcp:
            site: web.BaseSite = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        else:
            self.socket_dir = tempfile.mkdtemp(prefix="gateway-", dir=private_tmp())  # 0700: ours alone
            atexit.register(shutil.rmtree, self.socket_dir, True)
        return self

    async def door(self, lease: Lease) -> Connect:
        """How the rollout's relay reaches the gateway: its own socket, which answers its token only (on TCP, the
        shared port)."""
        if self.socket_dir is None:
            assert self.port is not None and self._runner is not None, "the gateway is not started"
            return tcp_target("127.0.0.1", self.port)
        path = f"{self.socket_dir}/r{next(self._door_ids)}.sock"
        site = web.UnixSite(self._runner, path)
        await site.start()
        self._doors[path], self._sites[path] = lease, site
        return unix_target(path)

    async def close_door(self, lease: Lease) -> None:
        for path in [p for p, owner in self._doors.items() if owner is lease]:
            del self._doors[path]
            await self._sites.pop(path).stop()
            with contextlib.suppress(OSError):
                os.unlink(path)

    @property
    def url(self) -> str:
        """The base URL on this host (TCP only; sandboxes use their relay's port instead)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def register(self, lease: Lease) -> None:
        self.leases[lease.token] = lease

    def unregister(self, lease: Lease) -> None:
        self.leases.pop(lease.token, None)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    # -- endpoints ---------------------------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        lease = self._lease(request)
        if lease is None:
            return _error(401, "unknown API key: use the OPENAI_API_KEY this rollout was given", "invalid_api_key")
        return web.json_response({"object": "list", "data": [{"id": lease.model_name, "object": "model",
                                                              "owned_by": "uni-agent"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        lease = self._lease(request)
        if lease is None:
            return _error(401, "unknown API key: use the OPENAI_API_KEY this rollout was given", "invalid_api_key")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON", "invalid_request_error")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return _error(400, "`messages` must be a non-empty list of message objects", "invalid_request_error")
        tools = body.get("tools") or None
        async with lease.lock:
            refused = self._over_budget(lease)
            if refused is not None:
                lease.refused += 1
                return refused
            answer, reply = await self._forward(lease, messages, tools, body.get("response_format"))
            if isinstance(answer, web.Response):
                lease.refused += 1
                return answer
        if body.get("stream"):
            return await _stream(request, answer, reply, lease.model_name,
                                 bool((body.get("stream_options") or {}).get("include_usage")))
        return web.json_response(_completion(answer, reply, lease.model_name))

    def _lease(self, request: web.Request) -> Lease | None:
        """The rollout a request belongs to: by its token, and, through a rollout's door, only that rollout's."""
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        lease = self.leases.get(token)
        door = request.transport.get_extra_info("sockname") if request.transport is not None else None
        if isinstance(door, str) and door in self._doors and self._doors[door] is not lease:
            return None
        return lease

    def _over_budget(self, lease: Lease) -> web.Response | None:
        if lease.ending is None and lease.calls.calls >= lease.max_calls:
            lease.finish(Ending(ExitReason.MAX_TURNS, f"the program made more than {lease.max_calls} model calls"))
        if lease.ending is None and lease.deadline is not None and time.monotonic() >= lease.deadline:
            lease.finish(Ending(ExitReason.WALL_CLOCK, "the episode ran past its wall-clock budget"))
        if (ending := lease.ending) is None:
            return None
        if ending.reason == ExitReason.CONTEXT_LIMIT:
            return _error(400, f"context length exceeded: {ending.error}", "context_length_exceeded")
        return _error(403, f"the episode is over ({ending.reason.value}): {ending.error}", "budget_exceeded")

    async def _forward(self, lease: Lease, messages: list[dict[str, Any]], tools: list[dict] | None,
                       response_format: dict[str, Any] | None) -> tuple[Any, ChatReply | None]:
        context, new_chain = lease.calls.continuation(messages)
        engine_messages, engine_tools = messages, tools
        if tools and lease.prompt_tools is not None:
            engine_messages, engine_tools = lease.prompt_tools.to_engine(messages, tools), None
            if lease.constrain_tool_calls and response_format is None:
                response_format = {"type": "json_object",
                                   "schema": decoding_schema(tools, lease.prompt_tools.tool_parser)}
        left = None if lease.deadline is None else lease.deadline - time.monotonic()
        try:
            async with asyncio.timeout(left):
                reply: ChatReply = await lease.model.chat(engine_messages, engine_tools, response_format,
                                                          context=context)
        except TimeoutError:
            lease.finish(Ending(ExitReason.WALL_CLOCK, "the episode ran past its wall-clock budget during a model "
                                                       "call"))
            return self._over_budget(lease), None
        except ContextLimitError as exc:
            lease.finish(Ending(ExitReason.CONTEXT_LIMIT, str(exc)))
            return self._over_budget(lease), None
        except LLMError as exc:  # the engine failed after the client's retries: the infrastructure's failure
            lease.finish(infra_failure(FailedPart.LLM, exc))
            return _error(502, f"the model endpoint failed: {exc}", "upstream_error"), None
        except Exception as exc:  # a fault of our own on the way (a reply we cannot read): the rollout's infra error
            log.exception("gateway_call_failed", rollout=lease.name)
            lease.finish(infra_failure(FailedPart.HARNESS, f"the gateway failed: {type(exc).__name__}: {exc}"))
            return _error(500, f"the gateway failed: {type(exc).__name__}", "gateway_error"), None
        said = reply.raw_text if reply.raw_text is not None and not reply.tool_calls else reply.content
        tool_calls = [{"type": "function", **c} for c in reply.tool_calls]
        if tools and lease.prompt_tools is not None and not tool_calls:
            said, tool_calls = lease.prompt_tools.to_program(said, tools)
        answer: dict[str, Any] = {"role": "assistant", "content": said}
        if tool_calls:
            answer["tool_calls"] = tool_calls
        lease.calls.add(messages, answer, reply, new_chain)
        lease.on_call(lease.calls.calls)
        return answer, reply


def _error(status: int, message: str, code: str) -> web.Response:
    kind = {401: "authentication_error", 403: "permission_error", 400: "invalid_request_error"}.get(status, "api_error")
    return web.json_response({"error": {"message": message, "type": kind, "code": code}}, status=status)


def _finish_reason(answer: dict[str, Any], reply: ChatReply | None) -> str:
    return "tool_calls" if answer.get("tool_calls") else ((reply.finish_reason if reply else None) or "stop")


def _usage(reply: ChatReply | None) -> dict[str, int]:
    prompt, completion = (reply.prompt_tokens, reply.completion_tokens) if reply else (0, 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _completion(answer: dict[str, Any], reply: ChatReply | None, model: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": answer, "logprobs": None,
                                         "finish_reason": _finish_reason(answer, reply)}],
            "usage": _usage(reply)}


async def _stream(request: web.Request, answer: dict[str, Any], reply: ChatReply | None, model: str,
                  include_usage: bool) -> web.StreamResponse:
    """The reply as server-sent chat.completion.chunk events: the role and text, the tool calls, the finish."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": answer.get("content") or ""}]
    for index, call in enumerate(answer.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": index, **call}]})
    events = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    events.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": _finish_reason(answer, reply)}]})
    if include_usage:
        events.append({**head, "choices": [], "usage": _usage(reply)})
    await response.write(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n")
    await response.write_eof()
    return response


_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future] = weakref.WeakKeyDictionary()


async def worker_gateway() -> Gateway:
    """The gateway of this agent worker (one per event loop), started on first use."""
    loop = asyncio.get_running_loop()
    started = _shared.get(loop)
    if started is None:
        started = _shared[loop] = asyncio.ensure_future(Gateway().start())
    return await asyncio.shield(started)
