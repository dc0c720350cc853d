"""structlog setup: JSON lines, one file per process, secrets redacted, bound to run/instance/rollout by callers; and
what strangers' connection attempts make Dask log kept off the user's console (RefusedConnections)."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import structlog
from structlog.tracebacks import ExceptionDictTransformer

from .fast_json import dumps_json
from .redact import redact

_configured: str | None = None


def _redact_event(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    return {k: redact(v) if isinstance(v, str) else v for k, v in event.items()}


def _redact_exception(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """An exception's message may carry what raised it (a URL with its key, a header): redacted like the fields."""
    _redact_exceptions(event.get("exception") or [])
    return event


def _redact_exceptions(chain: list[Any]) -> None:
    for exc in chain:  # the exception, its causes and contexts; a group's members are chains of their own (lists)
        if isinstance(exc, list):
            _redact_exceptions(exc)
        elif isinstance(exc, dict):
            if isinstance(exc.get("exc_value"), str):
                exc["exc_value"] = redact(exc["exc_value"])
            exc["exc_notes"] = [redact(n) if isinstance(n, str) else n for n in exc.get("exc_notes") or []]
            _redact_exceptions(exc.get("exceptions") or [])


# A traceback's frames without their local variables: those hold keys, headers and whole requests, which neither
# redaction (it sees the values only as repr text cut at 80 characters) nor the size of a log line should meet.
_TRACEBACKS = structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))


def _json_line(_: Any, __: str, event: dict[str, Any]) -> str:
    """The line, by the hot path's encoder (orjson; the driver writes one per recorded rollout, and the json module took
    a third of it), lenient: what is not JSON as its repr, as structlog's own renderer does."""
    return dumps_json(event, lenient=True).decode()


def configure_logging(log_dir: str | Path, process_name: str, level: str = "INFO") -> Path:
    """Send structlog events of this process to <log_dir>/<process_name>-<pid>.jsonl (idempotent per process)."""
    global _configured
    path = Path(log_dir) / f"{process_name}-{os.getpid()}.jsonl"
    if _configured == str(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _redact_event,  # before the level and the time are added: they are ours, and redacting them cost time
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _TRACEBACKS,
            _redact_exception,
            _json_line,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=LogFile(path)),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    _configured = str(path)
    keep_strangers_off_console()  # what another user's connection attempts make Dask log goes here, not to the console
    return path


class LogFile:
    """A log file whose write never raises: a full disk must not turn a log line into an exception in the middle of
    a run (it would end the run and lose its finished results). Lines that cannot be written are counted, and the
    first loss is said once on stderr."""

    def __init__(self, path: Path):
        self.path, self.dropped = path, 0
        self._file = path.open("a", buffering=1)

    def write(self, text: str) -> None:
        try:
            self._file.write(text)
        except OSError as exc:
            self._dropped(exc)

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError as exc:
            self._dropped(exc)

    def _dropped(self, exc: OSError) -> None:
        self.dropped += 1
        if self.dropped == 1:
            print(f"warning: log lines to {self.path} are being lost: {exc}", file=sys.stderr)


# -- what strangers make Dask log --------------------------------------------------------------------------------------

# The messages Dask's TLS listeners log for a connection that never became a peer: any local user can make one per
# connection attempt on any of the run's ports, so on the console they would be a stranger's way to fill the user's
# terminal. They say nothing the user can act on (the connection was refused, as it should be).
_REFUSED_CONNECTION_MESSAGES = frozenset({
    "Listener on %r: TLS handshake failed with remote %r: %s",
    "Connection from %s closed before handshake completed",
})
_REFUSED_LOGGER = "distributed.comm.tcp"
REFUSED_PER_MINUTE = 10  # lines in the run's log; more within a minute are counted in the next line, not written


class RefusedConnections(logging.Filter):
    """Keeps refused connections off the console: each goes to the run's log file instead (when this process has one,
    at most REFUSED_PER_MINUTE lines a minute, so refusals cannot fill the disk either), else to DEBUG."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = self.unlogged = 0
        self.window_start, self.in_window = 0.0, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in _REFUSED_CONNECTION_MESSAGES:
            return True  # everything else Dask says stays where it was
        self.refused += 1
        now = time.monotonic()
        if now - self.window_start >= 60:
            self.window_start, self.in_window = now, 0
        if self.in_window >= REFUSED_PER_MINUTE:
            self.unlogged += 1
            return False
        self.in_window += 1
        detail, unlogged = record.getMessage(), self.unlogged
        self.unlogged = 0
        if _configured is not None:
            structlog.get_logger("uni_agent.strangers").info("connection_refused", detail=detail,
                                                             refused_so_far=self.refused, not_logged_before=unlogged)
        else:
            logging.getLogger("uni_agent.strangers").debug("%s (%d refused so far)", detail, self.refused)
        return False


def keep_strangers_off_console() -> None:
    """Install RefusedConnections in this process (idempotent): the scheduler's and the workers' processes."""
    _add_filter_once(_REFUSED_LOGGER, RefusedConnections)


def _add_filter_once(logger_name: str, kind: type[logging.Filter]) -> None:
    """A `kind` filter on that logger, unless it has one (a preload may run twice in one process)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


# -- a lost heartbeat ---------------------------------------------------------------------------------------------

_HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat."


class HeartbeatFailedInOneLine(logging.Filter):
    """A worker's failed heartbeat as one line with its error, without Dask's traceback: at every cluster's close a
    heartbeat on its way when the scheduler shuts meets a closed stream, and the traceback it printed (a CI run caught
    one at the end of a run) told the user nothing the error's one line does not; a scheduler lost mid-run still says
    so, in that line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _HEARTBEAT_FAILED and record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            record.msg = f"{_HEARTBEAT_FAILED[:-1]}: {type(error).__name__}: {error}"
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


def heartbeat_failures_in_one_line() -> None:
    """Install HeartbeatFailedInOneLine on Dask's worker logger (idempotent): the workers' preload."""
    _add_filter_once("distributed.worker", HeartbeatFailedInOneLine)
