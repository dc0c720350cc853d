"""Dockerfile heredocs, read as BuildKit's frontend reads them (RUN / COPY / ADD, `<<EOF`, `<<'EOF'`, `<<-EOF`),
and Terminal-Bench task folders whose Dockerfiles use them converting to rows."""

from __future__ import annotations

import asyncio
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


def test_classic_dockerfile_turns_heredocs_into_context_files(tmp_path):
    """For builders without heredocs (buildah < 1.33: Debian 12's podman 4.3 reads `[service]` as an instruction):
    the same effect from files in a copy of the build context."""
    from uni_agent.terminal_bench.classic_dockerfile import classic_dockerfile, prepare_build_context

    path = tmp_path / "Dockerfile"
    path.write_text("FROM x\nARG WHO=you\nWORKDIR /w\n# kept\nRUN <<EOF\n#!/usr/bin/env python3\nprint(1)\nEOF\n"
                    "RUN --network=none cat > /w/a <<-'A' && echo done\n\tkeep $HOME\n\tA\n"
                    "COPY --chmod=600 <<EOF extra.txt /w/dir/\nhi $WHO\nEOF\n")
    text, files = classic_dockerfile(path, {"WHO": "Ada"})
    assert text == ("FROM x\nARG WHO=you\nWORKDIR /w\n# kept\n"
                    "COPY .uni-agent-heredoc/line-5/run /tmp/uni-agent-heredoc/line-5\n"
                    "RUN /tmp/uni-agent-heredoc/line-5\n"  # a shebang script runs itself
                    "COPY .uni-agent-heredoc/line-9/run /tmp/uni-agent-heredoc/line-9\n"
                    "RUN --network=none . /tmp/uni-agent-heredoc/line-9\n"
                    'COPY --chmod=600 [".uni-agent-heredoc/line-12/EOF", "extra.txt", "/w/dir/"]\n')
    assert files[".uni-agent-heredoc/line-5/run"] == ("#!/usr/bin/env python3\nprint(1)\n", 0o755)
    # the command, its raw body (the shell strips the tabs of <<-) and the bare terminator, as BuildKit rebuilds it
    assert files[".uni-agent-heredoc/line-9/run"] == ("cat > /w/a <<-'A' && echo done\n\tkeep $HOME\nA\n", 0o644)
    assert files[".uni-agent-heredoc/line-12/EOF"] == ("hi Ada\n", 0o644)  # expanded, with the build arg
    context, dockerfile = prepare_build_context(tmp_path, tmp_path / "scratch")
    assert dockerfile == context / "Dockerfile.classic" and (context / ".uni-agent-heredoc/line-9/run").exists()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "Dockerfile").write_text("FROM x\nWORKDIR /w\n")
    assert prepare_build_context(plain, tmp_path / "scratch2") == (plain, plain / "Dockerfile")


def test_heredoc_tasks_build_and_grade_on_podman(tmp_path):
    """The two heredoc tasks built for real with Debian's podman 4.3 (no heredoc support of its own) on the local
    test image, then graded in their images: the oracle earns 1, the empty answer 0."""
    from container_image import image_for_tests

    from uni_agent.config import AgentConfigs
    from uni_agent.terminal_bench.preprocess import convert_tasks
    from uni_agent.grading import verify_reference

    base, _ = image_for_tests()
    path, count, skipped = convert_tasks(FIXTURES, tmp_path, deployment="podman", build=True,
                                         build_args={"BASE_IMAGE": base}, build_network="none")
    assert (count, skipped) == (2, []), skipped
    agents = AgentConfigs.load(Path(__file__).resolve().parents[1] / "examples" / "agent_interaction"
                               / "agent_config_podman.yaml")
    for row in pq.read_table(path).to_pylist():
        agent = agents.for_row(row["agent_name"], row["extra_info"]["tools_kwargs"], row["instance_id"])
        oracle = asyncio.run(verify_reference(agent, "oracle"))
        empty = asyncio.run(verify_reference(agent, "empty"))
        assert (oracle.reward, empty.reward) == (1.0, 0.0), (row["instance_id"], oracle.error, oracle.log_tail)
