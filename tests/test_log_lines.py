"""Each structlog event is one JSON line (uni_agent.logs): orjson writes it, and what orjson refuses or cannot encode
still makes a line that the json module reads back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import structlog

from uni_agent.logs import configure_logging


def test_every_event_is_one_json_line_whatever_its_values(tmp_path):
    path = configure_logging(tmp_path, "t")
    log = structlog.get_logger("t")
    log.info("plain", instance_id="sim-000001", rollout=3, reward=0.5, exit_reason="submitted")
    log.info("odd", big=2**70, keys={1: "a", (2, 3): "b"})  # orjson refuses these: the json module writes the line
    log.info("not_json", path=Path("/a/b"), nan=math.nan, thing=object())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["event"] for r in lines] == ["plain", "odd", "not_json"]
    plain, odd, other = lines
    assert (plain["instance_id"], plain["rollout"], plain["reward"], plain["level"]) == ("sim-000001", 3, 0.5, "info")
    assert plain["timestamp"].endswith("Z")
    assert odd["big"] == 2**70 and odd["keys"] == {"1": "a"}  # a tuple key is left out, not a failed log call
    assert other["path"] == repr(Path("/a/b")) and other["nan"] is None and other["thing"].startswith("<object")


def test_a_workers_failed_heartbeat_is_one_line_with_its_error():
    """Dask's worker logs a failed heartbeat with its traceback; at a cluster's close one on its way always can meet
    the closed stream. The workers' preload makes it one line that still names the error; other lines keep theirs."""
    import io
    import logging

    from distributed.comm.core import CommClosedError

    from uni_agent.logs import heartbeat_failures_in_one_line

    heartbeat_failures_in_one_line()
    heartbeat_failures_in_one_line()  # idempotent: one filter
    logger = logging.getLogger("distributed.worker")
    assert sum(type(f).__name__ == "HeartbeatFailedInOneLine" for f in logger.filters) == 1
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    try:
        try:
            raise CommClosedError("in <TLS (closed) ConnectionPool.heartbeat_worker>: Stream is closed")
        except OSError:
            logger.exception("Failed to communicate with scheduler during heartbeat.")
        try:
            raise ValueError("something else")
        except ValueError:
            logger.exception("Some other failure")
    finally:
        logger.removeHandler(handler)
    first, rest = out.getvalue().split("\n", 1)
    assert first == ("Failed to communicate with scheduler during heartbeat: CommClosedError: in <TLS (closed) "
                     "ConnectionPool.heartbeat_worker>: Stream is closed")
    assert rest.startswith("Some other failure\nTraceback")  # other messages keep their traceback
