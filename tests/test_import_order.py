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


# The layers, lowest first: a module may import its own layer and those below, never one above. (Modules not named
# here, such as the bench, the CLI, the dashboard and the task sources, sit outside the chain and are not checked.)
# The registries of names, and the tool-call formats (pure text parsing), sit with config, which validates names
# against them; the tools themselves run commands in a sandbox and belong to the agent loop.
LAYERS = [
    ("config", ["uni_agent.config", "uni_agent.registry", "uni_agent.tool_calls", "uni_agent.tools.registry"]),
    ("sandbox", ["uni_agent.sandbox"]),
    ("grading", ["uni_agent.grading"]),
    ("agent loop", ["uni_agent.agent_loop", "uni_agent.conversation", "uni_agent.tools"]),
    ("worker", ["uni_agent.worker"]),
    ("driver", ["uni_agent.driver", "uni_agent.runner", "uni_agent.verify_run"]),
]


def layer_of(module: str) -> int | None:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


def test_imports_run_one_way_through_the_layers() -> None:
    """config → sandbox → grading → agent loop → worker → driver: nothing imports a layer above its own."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py") if "tasks/bundled" not in p.as_posix()
             and "terminal_bench/tasks" not in p.as_posix()}
    upward = []
    for name, path in sorted(paths.items()):
        own = layer_of(name)
        if own is None:
            continue
        for target in sorted(imports_of(path, set(paths))):
            layer = layer_of(target)
            if layer is not None and layer > own:
                upward.append(f"{name} ({LAYERS[own][0]}) imports {target} ({LAYERS[layer][0]})")
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """A sandbox module importing grading is caught (else the test above proves nothing)."""
    for name in ("sandbox", "grading"):
        (tmp_path / "uni_agent" / name).mkdir(parents=True)
        (tmp_path / "uni_agent" / name / "__init__.py").write_text("")
    (tmp_path / "uni_agent" / "sandbox" / "x.py").write_text("from ..grading import verify\n")
    (tmp_path / "uni_agent" / "grading" / "verify.py").write_text("")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "uni_agent"
    try:
        try:
            test_imports_run_one_way_through_the_layers()
        except AssertionError as exc:
            assert "uni_agent.sandbox.x (sandbox) imports uni_agent.grading" in str(exc)
        else:
            raise AssertionError("the upward import was not seen")
    finally:
        PACKAGE = saved
