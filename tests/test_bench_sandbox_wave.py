"""The sandbox bench's wave figure (issue 40, goal 4): sandboxes started, given a command and closed at once, and
what each cost the process that opened them. Real bubblewrap sandboxes, as the rollout bench's workers run them."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

from uni_agent.bench.sandbox_rtt import deployment, wave_cost

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def test_a_wave_costs_its_process_cpu_per_sandbox_and_leaves_nothing_behind(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "sandboxes"
    monkeypatch.setenv("UNI_AGENT_SANDBOX_ROOT", str(root))
    monkeypatch.setenv("UNI_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    before = time.process_time()
    per_sandbox, wall = asyncio.run(wave_cost(deployment("local", None), 6))
    spent = time.process_time() - before
    # Per sandbox, not in all: six sandboxes' starts, commands and closes cost this process more than one's share.
    assert 0 < per_sandbox * 6 <= spent
    assert wall > 0
    assert os.listdir(root) == [], "the wave left sandbox dirs"
