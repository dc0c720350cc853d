"""docs/layout.md names every module of the package, and only modules that exist: a module added, moved or deleted
without its line fails here (on 04c908e the page listed 12 of driver's 15 files and a runner.py that later moved)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = REPO_ROOT / "uni_agent"
DOC = REPO_ROOT / "docs" / "layout.md"
INDEX_HEADING = "## Every module"


def shipped_as_data(relative: Path) -> bool:
    """Files of the package data (pyproject's globs: the bundled tasks' repositories hold .py files that are task
    content, not modules of uni_agent)."""
    patterns = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for pattern in patterns["uni_agent"]:
        root = pattern.split("/**")[0] if "/**" in pattern else None  # `tasks/bundled/**/*`: all under tasks/bundled
        if (relative.is_relative_to(root) if root else fnmatch.fnmatch(relative.as_posix(), pattern)):
            return True
    return False


def package_modules() -> set[str]:
    """Every module of uni_agent/ as the doc writes it, relative to the package: `driver/run.py`, `cli.py`."""
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if "__pycache__" not in relative.parts and not shipped_as_data(relative):
            modules.add(relative.as_posix())
    return modules


def named_in_index(text: str) -> set[str]:
    """The modules the doc's index names: each line `- `path.py`: ...`, under a package heading or the top level."""
    index = text.split(INDEX_HEADING, 1)[1]
    return set(re.findall(r"^- `([\w/]+\.py)`", index, re.MULTILINE))


def test_every_module_is_named_in_docs_layout_md() -> None:
    named = named_in_index(DOC.read_text())
    modules = {m for m in package_modules() if not m.endswith("/__init__.py")}  # a package's heading names it
    missing = sorted(modules - named)
    assert not missing, f"docs/layout.md ({INDEX_HEADING!r}) lacks a line for: {missing}"


def test_every_module_named_in_docs_layout_md_exists() -> None:
    gone = sorted(named_in_index(DOC.read_text()) - package_modules())
    assert not gone, f"docs/layout.md names modules that do not exist: {gone}"


def test_every_package_has_a_heading() -> None:
    text = DOC.read_text().split(INDEX_HEADING, 1)[1]
    headings = set(re.findall(r"^### `(\w+)/`", text, re.MULTILINE))
    packages = {m.split("/")[0] for m in package_modules() if "/" in m}
    assert packages <= headings, f"packages without a heading in docs/layout.md: {sorted(packages - headings)}"


def test_the_check_reads_the_index_as_written(tmp_path: Path) -> None:
    """The reader finds bullet lines only (else the tests above prove nothing), and the data globs skip task files."""
    text = f"`driver/x.py` in prose\n{INDEX_HEADING}\n- `driver/run.py`: runs\n- `cli.py`: the command\n`a/b.py`\n"
    assert named_in_index(text) == {"driver/run.py", "cli.py"}
    assert shipped_as_data(Path("tasks/bundled/some-task/repo/pkg/mod.py"))
    assert not shipped_as_data(Path("tasks/swe_form.py"))
    assert "driver/run.py" in package_modules() and "cli.py" in package_modules()
