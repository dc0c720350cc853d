"""Telling a broken test environment from a wrong answer, in a SWE-bench eval log.

A grade of 0 must mean the answer was wrong. When the environment itself is broken (a package the tests import is
missing, the spec's install step failed, the test runner is not there), the official rule still says "unresolved",
and an RL run would blame the model. `environment_failure` reads the log and says why the environment, not the
answer, is at fault, or None. It is careful not to excuse an answer that broke the tests itself:

- the install step failed (pip's `ERROR:` lines, or a non-zero `exit` that the eval script echoes): the tests ran on
  an environment the spec did not make;
- some FAIL_TO_PASS / PASS_TO_PASS test did not run, and the log names a module that cannot be imported which the
  answer neither creates nor imports in a line it adds (a missing third-party package, `_pytest._version`);
- some did not run because the test runner or `conda` itself is missing (`command not found`);
- none of them ran, and the log mentions no file the answer changed (with an empty answer: none ran at all), unless
  the tests could not import a name from the repository's own code (`cannot import name 'X' from ... (/testbed/...)`):
  that name is what the answer had to add, so its absence is a wrong answer (an empty answer to pylint-4551).

An answer whose own file shows up in the log (a syntax error it introduced, an import it added) stays a wrong answer.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .grading import SweGrade

MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '?([\w.]+)'?")
COMMAND_NOT_FOUND = re.compile(r"^(?:.*: )?(\S+): command not found$", re.MULTILINE)
PIP_ERROR = re.compile(r"^ERROR: .+$", re.MULTILINE)
DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
# An import of the repository's own code that fails for a name it lacks: the tests need what the answer must add.
NAME_MISSING_IN_REPO = re.compile(r"cannot import name '?[\w.]+'? from '?[\w.]+'? \(/testbed/")
ADDED_IMPORT = re.compile(r"^\+\s*(?:from\s+([\w.]+)\s+import|import\s+([\w., ]+))", re.MULTILINE)


def environment_failure(log: str, grade: SweGrade, patch: str, install_command: str | None) -> str | None:
    """Why this log shows a broken environment rather than a wrong answer, or None (see the module docstring)."""
    install = install_failure(log, install_command)
    if install:
        return install
    tests = {**grade.fail_to_pass, **grade.pass_to_pass}
    missing = [t for t, status in tests.items() if status == "MISSING"]
    if not missing:
        return None
    for module in missing_modules(log):
        if not answer_owns_module(patch, module):
            return (f"{len(missing)} of {len(tests)} FAIL_TO_PASS/PASS_TO_PASS tests did not run: the log says "
                    f"No module named {module!r}, which the answer neither adds nor imports")
    for command in COMMAND_NOT_FOUND.findall(log):
        return f"{len(missing)} of {len(tests)} FAIL_TO_PASS/PASS_TO_PASS tests did not run: {command}: command not found"
    if len(missing) == len(tests) and not NAME_MISSING_IN_REPO.search(log):
        touched = patched_files(patch)
        if not any(path in log for path in touched):
            why = "the answer is empty" if not patch.strip() else "the log mentions no file the answer changed"
            return f"no FAIL_TO_PASS/PASS_TO_PASS test ran ({why})"
    return None


def install_failure(log: str, install_command: str | None) -> str | None:
    """The install step's failure, from the part of the log between its `+ <command>` trace line and the next
    traced command (the eval script runs under `set -x`)."""
    if not install_command:
        return None
    marker = f"+ {install_command}\n"
    start = log.find(marker)
    if start < 0:
        return None
    section = log[start + len(marker):]
    next_command = re.search(r"^\+ ", section, re.MULTILINE)
    section = section[: next_command.start()] if next_command else section
    errors = PIP_ERROR.findall(section)
    if errors:
        return f"the install step ({install_command}) failed: {errors[-1][:300]}"
    return None


def missing_modules(log: str) -> list[str]:
    return list(dict.fromkeys(MISSING_MODULE.findall(log)))


def answer_owns_module(patch: str, module: str) -> bool:
    """Whether the answer could be the cause of `module` missing: a line it adds imports that module (or its package,
    or one of its submodules), or it touches a file at that module's path."""
    for from_name, names in ADDED_IMPORT.findall(patch):
        imported = [from_name] if from_name else [n.strip().split(" ")[0] for n in names.split(",")]
        if any(name == module or name.startswith(module + ".") or module.startswith(name + ".")
               for name in imported if name):
            return True
    module_path = module.replace(".", "/")
    return any(module_path in path for path in patched_files(patch))


def patched_files(patch: str) -> list[str]:
    return list(dict.fromkeys(b for _, b in DIFF_FILE.findall(patch)))
