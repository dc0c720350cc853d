"""tests/unprivileged.py's own rule for users left behind: one it made in a test run that ended without removing it
(killed halfway) is made afresh, with none of that run's files; a user it did not make is never touched."""

from __future__ import annotations

import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from unprivileged import CREATOR_FILE, _created, ensure_user, remove_users, unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


def test_a_user_left_by_a_killed_run_is_made_afresh_and_anothers_user_is_left_alone():
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ended_pid = int(gone.stdout)  # a process that has ended
    left = ensure_user("ua-left-behind")
    try:
        (left.home / "old-run").write_text("the killed run's file")
        (left.home / CREATOR_FILE).write_text(f"{ended_pid}\n")
        _created.remove("ua-left-behind")  # as the next test process sees it: not made by that one
        again = ensure_user("ua-left-behind")
        assert not (again.home / "old-run").exists()
        assert int((again.home / CREATOR_FILE).read_text()) != ended_pid

        (again.home / CREATOR_FILE).unlink()  # now a user someone else made: kept as it is
        (again.home / "theirs").write_text("kept")
        _created.remove("ua-left-behind")
        same = ensure_user("ua-left-behind")
        assert (same.home / "theirs").read_text() == "kept" and same.uid == pwd.getpwnam("ua-left-behind").pw_uid
    finally:
        if "ua-left-behind" not in _created:
            _created.append("ua-left-behind")
        remove_users(["ua-left-behind"])
    with pytest.raises(KeyError):
        pwd.getpwnam("ua-left-behind")


def test_the_users_a_process_made_are_removed_when_it_exits():
    """Test modules that never call remove_users leave no user behind: the process that made them removes them as it
    exits."""
    tests_dir = str(Path(__file__).parent)
    made = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from unprivileged import ensure_user; "
         "print(ensure_user('ua-gone-at-exit').uid)", tests_dir], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    assert int(made.stdout.split()[-1]) > 0  # it existed while that process ran
    with pytest.raises(KeyError):
        pwd.getpwnam("ua-gone-at-exit")
