"""structlog setup: JSON lines, one file per process, secrets redacted, bound to run/instance/rollout by callers."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import structlog

from .redact import redact

_configured: str | None = None


def _redact_event(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    return {k: redact(v) if isinstance(v, str) else v for k, v in event.items()}


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
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact_event,
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=LogFile(path)),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    _configured = str(path)
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
