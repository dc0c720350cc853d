"""Write setting-edit tasks (see the package doc) as SWE-bench-form task directories: instance.json + repo/.

    write_tasks(Path("tasks/train"), split="train", count=16, seed=0)    # then swe_form.convert(folder, parquet)

A task's repo/ holds settings.py (5 settings) and tests/test_settings.py (the other settings keep their values:
PASS_TO_PASS); the hidden test patch adds tests/test_target.py (the asked-for value: FAIL_TO_PASS); the gold patch
changes the one line. Everything follows from (split, seed): the same call writes the same tasks.
"""

from __future__ import annotations

import difflib
import json
import random
from pathlib import Path
from typing import Any

# Setting names the tasks ask to change; train and held-out never share one (nor a filler with a target).
TRAIN_NAMES = ("RETRIES", "TIMEOUT", "PORT", "WORKERS", "BATCH_SIZE", "MAX_ITEMS", "CACHE_SIZE", "PAGE_SIZE",
               "LIMIT", "DEPTH", "INTERVAL", "THREADS", "BUFFER", "QUEUE_SIZE", "DELAY", "WIDTH")
HELDOUT_NAMES = ("HEIGHT", "COUNT", "LEVEL", "ROUNDS", "STEPS", "SEED", "OFFSET", "TTL")
FILLER_NAMES = ("VERSION", "NAME", "DEBUG", "HOST", "MODE", "COLOR", "REGION", "OWNER")
FILLER_VALUES = {"VERSION": '"1.0"', "NAME": '"demo"', "DEBUG": "False", "HOST": '"localhost"', "MODE": '"fast"',
                 "COLOR": '"blue"', "REGION": '"eu"', "OWNER": '"admin"'}
TEST_FILE = "tests/test_settings.py"
TARGET_TEST = "tests/test_target.py"

# Three levels of help, in turn (task i has level i % 3): the tool call itself written out (SmolLM2-135M copies it
# about half the time), its arguments in words (it calls str_replace_editor but leaves out old_str/new_str), or
# only the change (it lists the directory, as the system prompt's example call does). The task's prompt is this text.
LEVELS = {
    "call": "Set {name} to {new} in settings.py (it is {old} now). Make this call:\n<tool_call>\n"
            '{{"name": "str_replace_editor", "arguments": {{"command": "str_replace", "path": "settings.py", '
            '"old_str": "{name} = {old}", "new_str": "{name} = {new}"}}}}\n</tool_call>',
    "args": "In settings.py, change the line `{name} = {old}` to `{name} = {new}`: call `str_replace_editor` with "
            "command `str_replace`, path `settings.py`, old_str `{name} = {old}` and new_str `{name} = {new}`.",
    "plain": "In settings.py, change `{name} = {old}` to `{name} = {new}`.",
}


def write_tasks(folder: Path, split: str = "train", count: int = 16, seed: int = 0,
                test_cmd: str | None = None) -> list[Path]:
    """Write `count` tasks of `split` ("train" or "heldout") under `folder`; returns their directories. `test_cmd`:
    the grader's test command, where the sandbox's `python` is not the one with pytest."""
    names = {"train": TRAIN_NAMES, "heldout": HELDOUT_NAMES}[split]
    rng = random.Random(f"{split}-{seed}")
    folder.mkdir(parents=True, exist_ok=True)
    levels = list(LEVELS)
    return [_write_task(folder, f"uni-agent__setting_{split}-{i}", names[i % len(names)], levels[i % len(levels)],
                        rng, test_cmd) for i in range(count)]


def _write_task(folder: Path, instance_id: str, name: str, level: str, rng: random.Random,
                test_cmd: str | None) -> Path:
    old, new = rng.sample(range(2, 100), 2)
    fillers = rng.sample(FILLER_NAMES, 4)
    lines = [(f, FILLER_VALUES[f]) for f in fillers]
    lines.insert(rng.randrange(len(lines) + 1), (name, str(old)))
    before = _settings(lines)
    after = _settings([(n, str(new) if n == name else v) for n, v in lines])
    others = [(n, v) for n, v in lines if n != name]
    kept_test = "import settings\n\n\ndef test_other_settings_unchanged():\n" + "".join(
        f"    assert settings.{n} == {v}\n" for n, v in others)
    target_test = f"import settings\n\n\ndef test_{name.lower()}():\n    assert settings.{name} == {new}\n"
    task = folder / instance_id
    repo = task / "repo"
    (repo / "tests").mkdir(parents=True, exist_ok=True)
    (repo / "settings.py").write_text(before)
    (repo / TEST_FILE).write_text(kept_test)
    (repo / "pyproject.toml").write_text('[project]\nname = "settings-demo"\nversion = "0.1.0"\n\n'
                                         '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    instance: dict[str, Any] = {
        "instance_id": instance_id, "repo": "uni-agent/setting-edits", "version": "1.0", "base_commit": "generated",
        "created_at": "2026-12-03T00:00:00Z", "hints_text": "",
        "problem_statement": LEVELS[level].format(name=name, old=old, new=new), "level": level,
        "patch": _diff("settings.py", before, after),
        "test_patch": _diff(TARGET_TEST, "", target_test),
        "FAIL_TO_PASS": [f"{TARGET_TEST}::test_{name.lower()}"],
        "PASS_TO_PASS": [f"{TEST_FILE}::test_other_settings_unchanged"],
    }
    if test_cmd:
        instance["test_cmd"] = test_cmd
    (task / "instance.json").write_text(json.dumps(instance, indent=2) + "\n")
    return task


def _settings(lines: list[tuple[str, str]]) -> str:
    return '"""Settings of the service."""\n\n' + "".join(f"{n} = {v}\n" for n, v in lines)


def _diff(path: str, before: str, after: str) -> str:
    """A git-style unified diff of one file (`before` empty: a new file), as `git apply` takes it."""
    new_file = before == ""
    body = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                "/dev/null" if new_file else f"a/{path}", f"b/{path}")
    header = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if new_file else "")
    return header + "".join(body)


def task_rows(task_dirs: list[Path], agent_name: str = "swe_agent") -> list[dict[str, Any]]:
    """Dataset rows (seed schema) of written tasks, by the bundled tasks' converter (swe_form), with the task's own
    short prompt as the user message instead of the SWE recipe, which sends a small model exploring."""
    from ..swe_form import instance_to_row, load_instance

    rows = []
    for task in task_dirs:
        instance = load_instance(task)
        row = instance_to_row(instance, str(task / "repo"), agent_name)
        row["prompt"][1]["content"] = instance["problem_statement"]
        rows.append(row)
    return rows
