"""structlog setup: JSON lines, one file per process, secrets redacted, bound to run/instance/rollout by callers."""

from __future__ import annotations

import logging
import os
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
        logger_factory=structlog.WriteLoggerFactory(file=path.open("a", buffering=1)),
        cache_logger_on_first_use=False,
    )
    _configured = str(path)
    return path
