"""The outcome of grading one answer: what every grader returns and every result row records.

Its own module (importing nothing of uni_agent) so that the graders (grading/*.py, swebench/smith.py) and the records
that keep it (rollout.py) all import it without importing one another: imports run one way.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Verification:
    reward: float = 0.0
    resolved: bool = False
    patch_applied: bool = False
    status: str = "error"  # resolved | unresolved | patch_failed | timeout | error
    fail_to_pass: dict[str, str] = field(default_factory=dict)
    pass_to_pass: dict[str, str] = field(default_factory=dict)
    log_tail: str = ""
    error: str | None = None
    seconds: float = 0.0
    report: dict[str, Any] | None = None  # swe_bench: the official per-instance report (get_eval_report's shape)
    reward_source: str | None = None  # terminal_bench: reward.txt | reward.json
    metrics: dict[str, float] = field(default_factory=dict)  # terminal_bench: what the reward file held

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)
