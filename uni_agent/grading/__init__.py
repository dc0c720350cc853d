"""Grading: what a reward type is (grader.py), the graders by name (grader_names.py), and verification as coroutines
on the worker's event loop (verify.py).

Grading sits below the episode in the import layers (tests/test_import_order.py). Grading in the agent's own
sandbox reaches the agent loop as a hook (`grade_in_sandbox`, passed in by the worker), never by an import.

Graders (the row's `reward.name`):
- `swe_local` (swe_local.py): bundled and user tasks in SWE-bench form; pytest, our log parser (pytest_log.py).
- `swe_bench` (swe_bench.py): SWE-bench instances in the official images; the official eval script, log parsers and
  resolution rule from the `swebench` package (uni_agent/swebench/, needs the `swebench` extra). SWE-Gym and
  SWE-rebench rows too: they carry their own test spec (spec.row_spec).
- `swe_smith` (swe_smith.py): SWE-smith instances (a bug injected into the source, per-repository images, no test
  patch): the bug patch sets the task state, then SWE-smith's harness steps and grading rule (swebench/smith.py).
- `terminal_bench` (terminal_bench.py): Terminal-Bench 2 tasks; graded in the agent's own sandbox (its rows set
  in_agent_sandbox), or in a fresh sandbox of the task's image with the patch applied; the hidden tests run and write
  /logs/verifier/reward.txt|json. The oracle runs solution/solve.sh first.
"""

from ..verification import Verification
from .grader import Grader
from .grader_names import GRADERS, check_reward_config, grader_for, known_graders, register_grader
from .verify import ReferenceKind, grade_in_sandbox, verify_patch, verify_reference

__all__ = ["GRADERS", "Grader", "ReferenceKind", "Verification", "check_reward_config", "grade_in_sandbox",
           "grader_for", "known_graders", "register_grader", "verify_patch", "verify_reference"]
