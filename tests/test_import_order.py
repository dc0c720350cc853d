"""Imports inside uni_agent run one way: no module imports, directly or through others, a module that imports it.

Every import counts, also those inside functions and under TYPE_CHECKING: a circle hidden in a function still ties the
modules together. Checked statically (ast), so importing nothing heavy."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "uni_agent"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports (relative and absolute forms)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            root = ".".join(base + ([node.module] if node.module else []))
            targets = [root] + [f"{root}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def test_no_import_circle_in_the_package() -> None:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py") if "tasks/bundled" not in p.as_posix()
             and "terminal_bench/tasks" not in p.as_posix()}
    graph = {name: imports_of(path, set(paths)) for name, path in paths.items()}
    circles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append(" -> ".join(trail[trail.index(target):] + [target]))
            elif target not in state:
                visit(target, trail + [target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_check_sees_a_circle(tmp_path: Path) -> None:
    """The import reader finds relative, absolute and function-level imports (else the test above proves nothing)."""
    (tmp_path / "uni_agent").mkdir()
    a = tmp_path / "uni_agent" / "a.py"
    a.write_text("def f():\n    from .b import g\n")
    b = tmp_path / "uni_agent" / "b.py"
    b.write_text("import uni_agent.a\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "uni_agent"
    try:
        assert imports_of(a, {"uni_agent.a", "uni_agent.b"}) == {"uni_agent.b"}
        assert imports_of(b, {"uni_agent.a", "uni_agent.b"}) == {"uni_agent.a"}
    finally:
        PACKAGE = saved
