"""Imports inside uni_agent run one way: no module imports, directly or through others, a module that imports it, and
no package (uni_agent.X) does either.

Every import counts, also those inside functions and under TYPE_CHECKING: a circle hidden in a function still ties the
modules together. So does an import path written as a string ("uni_agent.tools.submit:Submit" in a registry, a
`_target_`): it is imported at run time all the same. Checked statically (ast), so importing nothing heavy."""

from __future__ import annotations

import ast
import re
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


# "uni_agent.x.y:name" or "uni_agent.x.y.ClassName" (a logger's name, "uni_agent.llm", names no object)
IMPORT_PATH = re.compile(r"uni_agent(?:\.\w+)+:\w+|uni_agent(?:\.\w+)*\.[A-Z]\w*")


def string_imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` names in import-path strings ("uni_agent.x.y:name", "uni_agent.x.y.Class"):
    each the longest module the string starts with."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and IMPORT_PATH.fullmatch(node.value):
            parts = node.value.split(":")[0].split(".")
            for end in range(len(parts), 1, -1):
                if ".".join(parts[:end]) in modules:
                    found.add(".".join(parts[:end]))
                    break
    return found - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    """module -> the modules it imports, by statement or by import-path string."""
    paths = package_modules()
    modules = set(paths)
    return {name: imports_of(path, modules) | string_imports_of(path, modules) for name, path in paths.items()}


def package_of(module: str) -> str:
    """uni_agent.X for a module in package X or the module X itself; the root package is itself."""
    return ".".join(module.split(".")[:2])


def circles_in(graph: dict[str, set[str]]) -> list[str]:
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
    return circles


def test_no_import_circle_in_the_package() -> None:
    circles = circles_in(import_graph())
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_import_circle_between_packages() -> None:
    """uni_agent.config, uni_agent.sandbox, uni_agent.tools, ...: each package, taken whole, imports one way too."""
    packages: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        own = package_of(module)
        packages.setdefault(own, set()).update(package_of(t) for t in targets if package_of(t) != own)
    circles = circles_in(packages)
    assert not circles, "import circles between packages:\n" + "\n".join(circles)


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


def test_the_check_sees_string_paths_and_package_circles(tmp_path: Path) -> None:
    """A registry's "module:Name" string is an import; p.a -> q.b and q.c -> p.d tie packages p and q although no
    module circle exists (else the tests above prove nothing)."""
    for package in ("p", "q"):
        (tmp_path / "uni_agent" / package).mkdir(parents=True)
        (tmp_path / "uni_agent" / package / "__init__.py").write_text("")
    (tmp_path / "uni_agent" / "__init__.py").write_text("")
    (tmp_path / "uni_agent" / "p" / "a.py").write_text('THING = "uni_agent.q.b:Thing"\n')
    (tmp_path / "uni_agent" / "q" / "b.py").write_text("")
    (tmp_path / "uni_agent" / "q" / "c.py").write_text("from ..p import d\n")
    (tmp_path / "uni_agent" / "p" / "d.py").write_text("")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "uni_agent"
    try:
        assert import_graph()["uni_agent.p.a"] == {"uni_agent.q.b"}
        assert not circles_in(import_graph())
        try:
            test_no_import_circle_between_packages()
        except AssertionError as exc:
            assert "uni_agent.p -> uni_agent.q -> uni_agent.p" in str(exc), exc
        else:
            raise AssertionError("the package circle was not seen")
    finally:
        PACKAGE = saved


# The layers, lowest first: a module may import its own layer and those below, never one above. Every module of the
# package belongs to one (test_every_module_has_a_layer); a name covers the module or package it names and everything
# under it, and the longest name that matches decides (`uni_agent.tools.tool_names` is config, the other tools are not).
# The registries of names and the tool-call formats (pure text parsing) sit with config, which validates names against
# them, and so does the base of the deployment configs (sandbox.base, beside the sandbox protocol). The process
# boundaries show in the order: engines serve the episode over HTTP, the episode runs in an agent worker, the driver
# runs the episodes; the test kit (uni_agent.testing) sits at the top, so no production module imports a fake.
ROOT = "uni_agent"
LAYERS = [
    ("foundation", ["uni_agent.registry", "uni_agent.redact", "uni_agent.logs", "uni_agent.current_worker",
                    "uni_agent.worker_resources", "uni_agent.events", "uni_agent.fast_json", "uni_agent.gc_policy",
                    "uni_agent.dask_profiler", "uni_agent.dask_timers", "uni_agent.worker_monitor"]),
    ("config", ["uni_agent.config", "uni_agent.settings", "uni_agent.tool_calls", "uni_agent.tools.tool_names",
                "uni_agent.engines.engine_names", "uni_agent.sandbox.base", "uni_agent.sandbox.deployment_types"]),
    ("sandbox", ["uni_agent.sandbox", "uni_agent.private_dirs", "uni_agent.cache_maintenance"]),
    ("tools", ["uni_agent.tools"]),
    ("llm", ["uni_agent.llm"]),
    ("tasks and grading", ["uni_agent.verification", "uni_agent.grading", "uni_agent.swebench", "uni_agent.tasks",
                           "uni_agent.terminal_bench", "uni_agent.envs"]),
    ("engines", ["uni_agent.engines"]),
    ("episode", ["uni_agent.episode", "uni_agent.agent_loop", "uni_agent.harness"]),
    ("dashboard", ["uni_agent.dashboard"]),
    ("driver", ["uni_agent.driver", "uni_agent.online", "uni_agent.training"]),
    ("entry points", [ROOT, "uni_agent.cli", "uni_agent.settings_reference", "uni_agent.scheduler_preload",
                      "uni_agent.worker_preload",
                      "uni_agent.reports", "uni_agent.bench", "uni_agent.testing"]),
]


def layer_of(module: str) -> int | None:
    """The layer of the longest name in LAYERS that is `module` or a package above it (the root package only itself)."""
    best: tuple[int, int] | None = None  # (length of the name, layer)
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            covers = module == name or (name != ROOT and module.startswith(name + "."))
            if covers and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "tasks/bundled" not in p.as_posix()
            and "terminal_bench/tasks" not in p.as_posix()}


def test_every_module_has_a_layer() -> None:
    """A module no layer names would escape the check below: a new one must be placed."""
    unplaced = sorted(name for name in package_modules() if layer_of(name) is None)
    assert not unplaced, "modules in no layer (add them to LAYERS):\n" + "\n".join(unplaced)


def test_the_coverage_check_sees_an_unplaced_module(tmp_path: Path) -> None:
    (tmp_path / "uni_agent").mkdir()
    (tmp_path / "uni_agent" / "__init__.py").write_text("")
    (tmp_path / "uni_agent" / "config.py").write_text("")
    (tmp_path / "uni_agent" / "stray.py").write_text("")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "uni_agent"
    try:
        try:
            test_every_module_has_a_layer()
        except AssertionError as exc:
            assert "uni_agent.stray" in str(exc) and "uni_agent.config" not in str(exc), exc
        else:
            raise AssertionError("the unplaced module was not seen")
    finally:
        PACKAGE = saved


def test_imports_run_one_way_through_the_layers() -> None:
    """foundation → config → … → episode → driver → entry points: nothing imports a layer above its own."""
    paths = package_modules()
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
