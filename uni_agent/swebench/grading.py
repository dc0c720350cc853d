"""Grading a SWE-bench eval log with the official pieces: the repo's log parser (`MAP_REPO_TO_PARSER`, or the one a
SWE-rebench / SWE-Gym row's spec names), the
report (`get_eval_tests_report`) and the resolution rule (`get_resolution_status`: FULL when every FAIL_TO_PASS test
passes and every PASS_TO_PASS test still passes; only FULL counts as resolved).

What we do ourselves is what `swebench.harness.grading.get_logs_eval` does with a log *file*, here on the log text
(swebench 4.1.0's order): a log holding one of the harness's failure markers, or lacking either test-output marker,
has no results ("patch not applied"); otherwise the text between the markers is parsed, and when that yields nothing
the whole log is. tests/test_swebench_equivalence.py checks that the report below equals `get_eval_report`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .spec import log_parser, official_test_spec

MISSING = "MISSING"  # our label for a test the log does not mention (the official rule counts it as failed)


@dataclass
class SweGrade:
    instance_id: str
    tests_found: bool  # the log had the test-output markers and no harness failure marker
    status_map: dict[str, str]  # every test the parser found → PASSED / FAILED / ERROR / SKIPPED / XFAIL ...
    fail_to_pass: dict[str, str]  # each FAIL_TO_PASS test → its status, MISSING when absent
    pass_to_pass: dict[str, str]
    tests_status: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # the official report's
    resolution: str = "RESOLVED_NO"  # RESOLVED_FULL / RESOLVED_PARTIAL / RESOLVED_NO
    resolved: bool = False

    def report(self, model_patch: str | None) -> dict[str, Any]:
        """This grade in the shape of the official `get_eval_report(..., include_tests_status=True)`."""
        entry: dict[str, Any] = {"patch_is_None": model_patch is None, "patch_exists": model_patch is not None,
                                 "patch_successfully_applied": False, "resolved": False}
        if model_patch is not None and self.tests_found:
            entry["patch_successfully_applied"] = True
            entry["resolved"] = self.resolved
            entry["tests_status"] = self.tests_status
        return {self.instance_id: entry}


def status_map_from_log(test_spec: Any, log: str, parser: Any) -> tuple[dict[str, str], bool]:
    """(test → status, whether test results were found), following 4.1.0's get_logs_eval; `parser` is the row's
    official log parser (spec.log_parser: the repository's, or the one its own spec names, as SWE-rebench's
    harness fork picks it)."""
    from swebench.harness.constants import (
        APPLY_PATCH_FAIL, END_TEST_OUTPUT, RESET_FAILED, START_TEST_OUTPUT, TESTS_ERROR, TESTS_TIMEOUT)

    if any(marker in log for marker in (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT)):
        return {}, False
    if START_TEST_OUTPUT not in log or END_TEST_OUTPUT not in log:
        return {}, False
    between = log.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
    return parser(between, test_spec) or parser(log, test_spec), True


def grade_log(instance: Mapping[str, Any], log: str) -> SweGrade:
    """Grade the output of the eval script for one instance (its metadata: repo, version, tests, test_patch)."""
    from swebench.harness.constants import (
        FAIL_ONLY_REPOS, FAIL_TO_PASS, KEY_INSTANCE_ID, PASS_TO_PASS, EvalType, ResolvedStatus)
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status

    test_spec = official_test_spec(instance)
    status_map, found = status_map_from_log(test_spec, log, log_parser(instance))
    grade = SweGrade(
        instance_id=test_spec.instance_id, tests_found=found, status_map=status_map,
        fail_to_pass={t: status_map.get(t, MISSING) for t in test_spec.FAIL_TO_PASS},
        pass_to_pass={t: status_map.get(t, MISSING) for t in test_spec.PASS_TO_PASS},
    )
    if not found:
        return grade
    eval_type = EvalType.FAIL_ONLY if test_spec.repo in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL
    gold = {KEY_INSTANCE_ID: test_spec.instance_id, FAIL_TO_PASS: test_spec.FAIL_TO_PASS,
            PASS_TO_PASS: test_spec.PASS_TO_PASS}
    grade.tests_status = get_eval_tests_report(status_map, gold, eval_type=eval_type)
    grade.resolution = get_resolution_status(grade.tests_status)
    grade.resolved = grade.resolution == ResolvedStatus.FULL.value
    return grade
