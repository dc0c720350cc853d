"""A grader written from docs/extending.md alone: the doc's code block, saved as the doc says (mypkg/graders.py),
registers by its short name and passes `uni-agent verify --patch gold` (resolved) and `--patch empty` (a wrong
answer) on a bundled task, through the CLI, its LocalCluster's worker processes (which import the grader from
PYTHONPATH, as the doc says) and a real bubblewrap sandbox. On 04c908e the doc's grader had no `name` and no
`solves_by_script`, and verify --patch gold raised AttributeError."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from uni_agent.grading import grader_for, register_grader
from uni_agent.grading.grader_names import GRADERS
from uni_agent.tasks.swe_form import convert

DOC = Path(__file__).resolve().parent.parent / "docs" / "extending.md"
IMPORT_PATH = "mypkg.graders:FailToPassGrader"  # what the doc's rows name


def grader_code() -> str:
    """The first Python block of the doc's section on graders."""
    section = DOC.read_text().split("## A grader", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert blocks, "docs/extending.md's grader section has no ```python block"
    return blocks[0]


@pytest.fixture
def doc_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """mypkg/graders.py holding the doc's code, its directory on this process's path and the workers'."""
    package = tmp_path / "lib" / "mypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "graders.py").write_text(grader_code())
    monkeypatch.syspath_prepend(str(package.parent))
    yield package.parent
    for name in ("mypkg.graders", "mypkg"):
        sys.modules.pop(name, None)


def rows_naming(grader: str, where: Path) -> Path:
    """The bundled tasks as rows (uni-agent convert-tasks) whose reward names `grader`."""
    path = where / "rows.parquet"
    convert(None, path)
    rows = pq.read_table(path).to_pylist()
    for row in rows:
        row["extra_info"]["tools_kwargs"]["reward"]["name"] = grader
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_the_docs_grader_has_every_member_and_registers_by_name(doc_package: Path) -> None:
    grader_class = importlib.import_module("mypkg.graders").FailToPassGrader
    assert "fail_to_pass" not in GRADERS.names()
    try:
        register_grader(grader_class())  # reads grader.name
        assert isinstance(grader_for("fail_to_pass"), grader_class)
    finally:
        GRADERS.unregister("fail_to_pass")
    assert isinstance(grader_for(IMPORT_PATH), grader_class)  # by import path: made anew for each use


@pytest.mark.parametrize(("patch", "bucket", "reward"), [("gold", "resolved", 1.0), ("empty", "wrong_answer", 0.0)])
def test_verify_grades_the_gold_and_the_empty_patch_with_the_docs_grader(
        doc_package: Path, tmp_path: Path, patch: str, bucket: str, reward: float) -> None:
    data = rows_naming(IMPORT_PATH, tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(doc_package), os.environ.get("PYTHONPATH")]))}
    out = tmp_path / f"verify-{patch}"
    done = subprocess.run([sys.executable, "-m", "uni_agent.cli", "verify", "--patch", patch, "--data-path", str(data),
                           "--max-samples", "1", "--local-workers", "1", "--output-dir", str(out)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    graded = pd.read_parquet(out / f"verify_{patch}.parquet")
    assert len(graded) == 1
    row = graded.iloc[0]
    assert (row.bucket, row.reward, row.error) == (bucket, reward, None), row.to_dict()
    verification = json.loads(row.verification)
    assert verification["patch_applied"], verification
    assert re.search(r"\d+ (passed|failed)", verification["log_tail"]), verification  # pytest ran the tests
