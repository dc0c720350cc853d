"""What a stranger tries against the address of a Dask scheduler or worker: plain tcp, TLS without a certificate, TLS
with credentials of its own (each sends `identity` and waits for the answer), a Client that would `run` code, and a
raw TCP connect to the port, which must succeed: the port is reachable, so a refusal is the authentication's doing.

Importable by the tests, and runnable as another user (`python stranger.py ADDRESS...` prints one JSON object:
address -> attempt -> outcome), which imports only distributed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import sys
from typing import Any

ATTEMPTS = ("tcp", "tls without a certificate", "tls with its own credentials", "client.run over tcp")


async def identity(address: str, timeout: float = 10, **connection_args: Any) -> dict:
    """Dask's `identity` call over one comm: what any peer answers once the connection is accepted."""
    from distributed.comm import connect

    comm = await connect(address, timeout=timeout, **connection_args)
    try:
        await comm.write({"op": "identity", "reply": True})
        return await asyncio.wait_for(comm.read(), timeout)
    finally:
        comm.abort()


def anonymous_tls() -> ssl.SSLContext:
    """A TLS client that trusts anything and presents no certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def _outcome(call: Any) -> str:
    try:
        return f"CONNECTED: {await call}"[:300]
    except Exception as exc:  # every way of not getting in
        return f"refused: {type(exc).__name__}: {exc}"[:300]


async def _client_run(address: str, timeout: float) -> Any:
    from distributed import Client

    async with Client(address, asynchronous=True, timeout=timeout) as client:
        return await client.run(os.getuid)


async def attempts(address: str, timeout: float = 10) -> dict[str, str]:
    """Each attempt on `address` (tls://host:port) and how it ended, plus whether the port is reachable at all."""
    from distributed.security import Security

    host, port = address.split("://")[1].rsplit(":", 1)
    plain = address.replace("tls://", "tcp://")
    own = Security.temporary().get_connection_args("client")
    calls = {
        "tcp": identity(plain, timeout),
        "tls without a certificate": identity(address, timeout, ssl_context=anonymous_tls(), require_encryption=True),
        "tls with its own credentials": identity(address, timeout, **own),
        "client.run over tcp": _client_run(plain, timeout),
    }
    out = {name: await _outcome(call) for name, call in calls.items()}
    try:
        socket.create_connection((host, int(port)), timeout).close()
        out["port reachable"] = "yes"
    except OSError as exc:
        out["port reachable"] = f"no: {exc}"
    return out


def got_in(report: dict[str, dict[str, str]]) -> list[str]:
    """The attempts that got in, and the ports that were not even reachable (where a refusal proves nothing)."""
    wrong = []
    for address, outcomes in report.items():
        wrong += [f"{address} {name}: {outcomes[name]}" for name in ATTEMPTS
                  if not outcomes[name].startswith("refused")]
        if outcomes["port reachable"] != "yes":
            wrong.append(f"{address} not reachable: {outcomes['port reachable']}")
    return wrong


async def _main(addresses: list[str]) -> dict[str, dict[str, str]]:
    return {address: await attempts(address) for address in addresses}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_main(sys.argv[1:]))))
