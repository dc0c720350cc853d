"""SWE-bench (Verified) tasks: preprocessing, the official eval script, official grading. (A run's predictions
for the official harness are exported from its results by uni_agent/reports/swebench_predictions.py.)

Which `swebench` API, and why (pinned in pyproject.toml's `swebench` extra as `swebench==4.1.0`):

- The official SWE-bench Verified rows carry `repo`, `version`, `base_commit`, `test_patch`, FAIL_TO_PASS and
  PASS_TO_PASS, and nothing more about how to test them. swebench **4.1.0** turns exactly that into the test
  command, the test directives, the eval script and the log parser (`MAP_REPO_VERSION_TO_SPECS`,
  `get_test_directives`, `make_eval_script_list`, `MAP_REPO_TO_PARSER`), offline.
- swebench **5.x** dropped that table: its `make_test_spec(instance)` needs rows that already carry `image`,
  `eval_script`, `log_parser` and `eval_type` (a classic row raises KeyError 'image'), so it cannot grade the
  classic dataset on its own. 5.x also changed the grading rules in a few corners (a skipped FAIL_TO_PASS test fails,
  a skipped PASS_TO_PASS test is kept, truncated parametrised ids match by prefix, the test command's exit code is
  cross-checked, a run with no results is invalid).
- Both cannot be installed side by side (one import name), so we pin 4.1.0 and grade with its rules, which are the
  rules the published SWE-bench Verified numbers were computed with. To cross-check a run, export `preds.jsonl`
  (`uni-agent export-preds`) and run the official harness of the same version: `python -m
  swebench.harness.run_evaluation --predictions_path preds.jsonl ...` with swebench==4.1.0.

Everything here imports `swebench` lazily (it pulls datasets, docker, modal, ...): the rest of uni-agent works
without the extra installed.
"""

from __future__ import annotations

from types import ModuleType

from ..config import ConfigError

SWEBENCH_VERSION = "4.1.0"
INSTALL_HINT = "pip install 'uni-agent[swebench]' (swebench==4.1.0)"


def require_swebench() -> ModuleType:
    """The installed `swebench` package, checked to be the 4.x API we build on; a clear error otherwise."""
    try:
        import swebench
    except ImportError:
        raise ConfigError(f"SWE-bench tasks need the official `swebench` package: {INSTALL_HINT}") from None
    version = getattr(swebench, "__version__", "?")
    if not str(version).startswith("4."):
        raise ConfigError(
            f"swebench {version} is installed, but uni-agent builds SWE-bench eval scripts with the 4.x API "
            f"(MAP_REPO_VERSION_TO_SPECS, gone in 5.0): {INSTALL_HINT}")
    return swebench
