"""Dockerfile heredocs, read as BuildKit's frontend reads them (RUN / COPY / ADD, `<<EOF`, `<<'EOF'`, `<<-EOF`),
and Terminal-Bench task folders whose Dockerfiles use them converting to rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from uni_agent.config import ConfigError
from uni_agent.terminal_bench.dockerfile import materialize_workspace, parse_dockerfile

FIXTURES = Path(__file__).parent / "fixtures" / "terminal_bench_heredoc"


def _parse(tmp_path: Path, text: str):
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return parse_dockerfile(path)


def test_run_heredoc_bodies_are_not_instructions(tmp_path):
    # The form from the field: a file written by `cat` from a quoted heredoc, with lines that look like
    # instructions (FROM, a comment, a continuation) inside the body.
    info = _parse(tmp_path, "FROM python:3.12\nWORKDIR /app\n"
                            "RUN cat > /app/config.ini << 'EOF'\n[main]\nFROM = here\n# not a comment\n"
                            "value = a \\\nEOF\n"
                            "RUN <<EOF\napt-get update\nFROBNICATE\nEOF\n"
                            "RUN <<-EOT bash\n\tset -e\n\techo $HOME\n\tEOT\n"
                            "ENV AFTER=1\n")
    assert info.workdir == "/app"
    assert info.env == {"AFTER": "1"}  # parsing went on after the three heredocs
    assert len(info.host_blockers) == 3 and all("RUN" in b for b in info.host_blockers)


def test_copy_heredoc_makes_files_with_buildkit_expansion_rules(tmp_path):
    info = _parse(tmp_path, "FROM x\nARG NAME=world\nENV GREETING=hello\nWORKDIR /app\n"
                            "COPY <<EOF /app/expanded.txt\n$GREETING ${NAME}\nEOF\n"
                            "COPY <<'EOF' /app/literal.sh\necho $GREETING\nEOF\n"
                            "COPY <<-EOF /app/chomped.txt\n\t\tindented\n\tEOF\n"
                            "COPY <<one.txt <<two.txt /app/sub/\nfirst\none.txt\nsecond\ntwo.txt\n"
                            "ADD <<EOF /app/added.txt\nvia add\nEOF\n")
    assert info.host_compatible, info.host_blockers
    workspace = tmp_path / "ws"
    materialize_workspace(info, tmp_path, workspace)
    assert (workspace / "expanded.txt").read_text() == "hello world\n"
    assert (workspace / "literal.sh").read_text() == "echo $GREETING\n"  # quoted terminator: no expansion
    assert (workspace / "chomped.txt").read_text() == "indented\n"
    assert (workspace / "sub" / "one.txt").read_text() == "first\n"
    assert (workspace / "sub" / "two.txt").read_text() == "second\n"
    assert (workspace / "added.txt").read_text() == "via add\n"


def test_heredoc_words_follow_buildkit_lexing(tmp_path):
    # `<< 'EOF'` (a blank after <<), an fd number, two heredocs on one line, and quoted `<<` that is no heredoc.
    info = _parse(tmp_path, "FROM x\nWORKDIR /w\n"
                            "RUN python3 3<<A << 'B'\nbody a\nA\nbody b\nB\n"
                            "RUN echo '<<NOT' \"<<NOT2\"\n"
                            "RUN [\"sh\", \"-c\", \"echo <<X\"]\n"
                            "ENV K=v\n")
    assert info.env == {"K": "v"}
    assert len(info.host_blockers) == 3


def test_bad_heredocs_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"Dockerfile:3: unterminated heredoc <<EOF"):
        _parse(tmp_path, "FROM x\nWORKDIR /w\nRUN cat <<EOF\nno end\n")
    with pytest.raises(ConfigError, match="cannot take a heredoc as its destination"):
        _parse(tmp_path, "FROM x\nWORKDIR /w\nCOPY a.txt <<EOF\nx\nEOF\n")
    # Heredocs belong to RUN/COPY/ADD only: elsewhere the body lines are instructions, as in BuildKit.
    with pytest.raises(ConfigError, match="unknown Dockerfile instruction 'BODY'"):
        _parse(tmp_path, "FROM x\nWORKDIR /w\nLABEL a=<<EOF\nbody\nEOF\n")


def test_heredoc_task_folders_convert(tmp_path):
    """Task folders whose Dockerfiles write files with heredocs (RUN and COPY forms) become rows; the COPY-only one
    runs on the local backend, with its heredoc files in the workspace."""
    from uni_agent.terminal_bench.preprocess import convert_tasks

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("heredoc-run", "heredoc-copy"):
        shutil.copytree(FIXTURES / name, tasks / name)
    path, count, skipped = convert_tasks(tasks, tmp_path / "out", deployment="podman")
    assert (count, skipped) == (2, []), skipped
    rows = {r["instance_id"]: r for r in pq.read_table(path).to_pylist()}
    assert set(rows) == {"heredoc-run", "heredoc-copy"}

    path, count, skipped = convert_tasks(tasks, tmp_path / "out", deployment="local")
    assert count == 1 and [p.task_id for p in skipped] == ["heredoc-run"], skipped
    assert "RUN cat > /app/service.ini" in skipped[0].error  # needs its image: the RUN, named
    row = pq.read_table(path).to_pylist()[0]
    workspace = Path(row["extra_info"]["tools_kwargs"]["env"]["deployment"]["repo"])
    assert (workspace / "greeter.py").read_text() == 'import sys\n\nprint(f"Helo, {sys.argv[1]}!")\n'
    assert "$GREETING is not expanded" in (workspace / "README").read_text()
