"""What one more TCP connection to a single address and port costs as the kernel's ephemeral ports fill up.

Every connection from this host to one address and port holds a local port of net.ipv4.ip_local_port_range (28,232
by default), shared by every process here. Linux's connect() looks for a free port among the odd ports of the range
first and takes an even one only when no odd port is left: past half the range, each connect() walks all the odd
ports before it finds an even one. This script holds connections open to a listener on loopback and prints the
CPU time of connect() per 1,000 new connections, against how full the range is, so the limit that
bench/measure.py's PORT_FILL keeps under is a figure of this machine, not a belief:

    python -m uni_agent.bench.connect_cost [--address 127.0.0.1] [--step 1000]

It stops at the open-file hard limit (one descriptor per connection) or when connect() fails (the range is used up).
The connections are non-blocking and never accepted: the port is taken inside connect() itself, which is what is
timed, whether or not the handshake completes.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import socket
import time

from .measure import PORT_FILL, port_range


def connect_costs(address: str = "127.0.0.1", step: int = 1000, limit: int | None = None) -> list[tuple[int, float]]:
    """(connections held, microseconds of CPU per connect() over the last `step`), until the range, the open-file
    limit or `limit` connections end it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    low, high = port_range()
    most = min(hard - 64, high - low + 1, limit or hard)
    held: list[socket.socket] = []
    rows: list[tuple[int, float]] = []
    with socket.socket() as listener:
        listener.bind((address, 0))
        listener.listen(128)  # never accepted: connect() takes its port before the handshake
        port = listener.getsockname()[1]
        try:
            while len(held) + step <= most:
                started = time.thread_time()
                for _ in range(step):
                    sock = socket.socket()
                    sock.setblocking(False)
                    held.append(sock)
                    with contextlib.suppress(BlockingIOError):
                        sock.connect((address, port))
                rows.append((len(held), (time.thread_time() - started) / step * 1e6))
        except OSError as exc:  # EADDRNOTAVAIL: no port left
            rows.append((len(held), float("nan")))
            print(f"connect() failed after {len(held):,} connections: {exc}")
        finally:
            for sock in held:
                sock.close()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--step", type=int, default=1000)
    parser.add_argument("--limit", type=int, default=None, help="stop after this many connections")
    args = parser.parse_args()
    low, high = port_range()
    ports = high - low + 1
    print(f"ephemeral ports {low}-{high} ({ports:,}); bench/measure.py keeps one address under {PORT_FILL:.0%} "
          f"({int(ports * PORT_FILL):,} connections)")
    print(f"{'connections':>11} | {'of the range':>12} | {'CPU us per connect()':>20}")
    for held, micros in connect_costs(args.address, args.step, args.limit):
        print(f"{held:>11,} | {held / ports:>11.0%} | {micros:>20.1f}")


if __name__ == "__main__":
    main()
