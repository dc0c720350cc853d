"""Grading a pytest log the SWE-bench way (the `swe_local` grader): per-test status from the log, then the
resolution rule (every FAIL_TO_PASS test passes and every PASS_TO_PASS test still passes). A test missing from the
log counts as not passed."""

from __future__ import annotations

import re
from dataclasses import dataclass

# pytest -rA summary lines: "PASSED tests/test_x.py::test_a", "FAILED tests/test_x.py::test_b - AssertionError".
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)")
PASSING = {"PASSED", "XFAIL"}


def parse_pytest_log(log: str) -> dict[str, str]:
    statuses: dict[str, str] = {}
    for line in log.splitlines():
        match = _SUMMARY_LINE.match(line.strip())
        if match:
            status, test = match.groups()
            # A test reported both as PASSED and as ERROR (teardown) did not pass.
            if statuses.get(test) in (None, "PASSED", "XFAIL"):
                statuses[test] = status
    return statuses


@dataclass(frozen=True)
class Grade:
    resolved: bool
    fail_to_pass: dict[str, str]  # test → status ("MISSING" when the log does not mention it)
    pass_to_pass: dict[str, str]

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0


def grade(fail_to_pass: list[str], pass_to_pass: list[str], statuses: dict[str, str]) -> Grade:
    f2p = {test: statuses.get(test, "MISSING") for test in fail_to_pass}
    p2p = {test: statuses.get(test, "MISSING") for test in pass_to_pass}
    resolved = all(s in PASSING for s in f2p.values()) and all(s in PASSING for s in p2p.values())
    return Grade(resolved=resolved, fail_to_pass=f2p, pass_to_pass=p2p)


def files_in_patch(patch: str) -> list[str]:
    """Paths a unified diff touches (new side, or old side for deletions), in order, without duplicates."""
    files: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            parts = line.split()
            if len(parts) >= 4:
                path = parts[3].removeprefix("b/")
                if path not in files:
                    files.append(path)
    return files
