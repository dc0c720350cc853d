"""The outcome of grading one answer: what every grader returns and every result row records.

A module of its own at the package's top level, importing nothing of uni_agent, below everything that uses it: the
graders (grading/), the SWE-bench harness steps they call (swebench/evaluate.py, swebench/smith.py) and the records
that keep it (episode/rollout.py, driver/). So grading imports swebench, and swebench imports nothing of grading.
A grader of your own fills the `Verification` it is handed (docs/extending.md).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any


class VerificationStatus(StrEnum):
    """How grading ended. The model's: unresolved, patch_failed, timeout (its answer hung the tests); the
    infrastructure's: error (the grader could not run), and a timeout of the driver's own bound (`no_result`)."""

    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"
    PATCH_FAILED = "patch_failed"
    TIMEOUT = "timeout"
    ERROR = "error"


EVAL_LOG_DIR = "eval_logs"  # under a run's output dir: one whole test log per graded rollout
NO_RESULT = "no verification result"  # starts the error of `no_result`


@dataclass
class Verification:
    reward: float = 0.0
    resolved: bool = False
    patch_applied: bool = False
    status: VerificationStatus = VerificationStatus.ERROR
    fail_to_pass: dict[str, str] = field(default_factory=dict)
    pass_to_pass: dict[str, str] = field(default_factory=dict)
    log_tail: str = ""
    error: str | None = None
    seconds: float = 0.0
    report: dict[str, Any] | None = None  # swe_bench: the official per-instance report (get_eval_report's shape)
    reward_source: str | None = None  # terminal_bench: reward.txt | reward.json
    metrics: dict[str, float] = field(default_factory=dict)  # terminal_bench: what the reward file held
    log_file: str | None = None  # the whole test log, kept beside the results (keep_log), relative to the output dir
    log: str = field(default="", repr=False)  # the whole test log; travels to the driver, never into the row
    # No result came back within the driver's own bound (`no_result`): the infrastructure's failure, which a slow
    # test (the grader's own timeout, the model's) is not. Not stored: the row's failure_kind says it.
    lost: bool = False

    def to_json(self) -> str:
        record = asdict(self)
        record.pop("log")  # megabytes per row otherwise: the file named by log_file holds it
        record.pop("lost")
        return json.dumps(record, ensure_ascii=False)

    def keep_log(self, output_dir: str | Path, name: str) -> None:
        """Write the whole test log to <output_dir>/eval_logs/<name>.log (name: the row's instance and rollout, or
        the patch kind of a gold check) and record its path; the row keeps only log_tail. Nothing without a log."""
        if not self.log:
            return
        directory = Path(output_dir) / EVAL_LOG_DIR
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # logs hold hidden tests: private like the rows
        path = directory / f"{re.sub(r'[^A-Za-z0-9._-]', '_', name)}.log"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.log, encoding="utf-8", errors="replace")
        os.replace(tmp, path)
        self.log_file = str(path.relative_to(output_dir))


def no_result(limit: float) -> Verification:
    """What the driver records when a verification future gave nothing within `limit` seconds."""
    return Verification(status=VerificationStatus.TIMEOUT, error=f"{NO_RESULT} within {limit:g} s", lost=True)
