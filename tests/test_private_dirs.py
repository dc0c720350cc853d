"""The output dir and the file-creation mask of a run: private by default, readable by the group when asked, and an
output dir another user could tamper with refused with a message that names it and the way out."""

import os
import stat

import pytest

from uni_agent.private_dirs import UnsafeDirectory, prepare_output_dir, private_files


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_output_dir_is_private_and_files_made_during_a_run_too(tmp_path):
    out = prepare_output_dir(tmp_path / "a" / "out")
    assert _mode(out) == 0o700
    with private_files():
        (out / "results.parquet").write_text("x")
        (out / "logs").mkdir()
    assert _mode(out / "results.parquet") == 0o600 and _mode(out / "logs") == 0o700
    before = os.umask(0o022)
    os.umask(before)
    with private_files():
        pass
    assert os.umask(before) == before  # put back for the code that called the run


def test_shared_with_the_group_the_group_may_read_but_not_write(tmp_path):
    out = prepare_output_dir(tmp_path / "out", share_with_group=True)
    with private_files(share_with_group=True):
        (out / "summary.json").write_text("{}")
    assert _mode(out) == 0o750 and _mode(out / "summary.json") == 0o640


def test_an_existing_output_dir_open_to_others_is_closed(tmp_path):
    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    out.chmod(0o755)
    prepare_output_dir(out)
    assert _mode(out) == 0o700


def test_an_output_dir_anyone_may_write_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match=f"output dir {out} is writable by others .*choose another --output-dir"):
        prepare_output_dir(out)
