"""The grader registry (reward.name → grader, checked before anything runs) and verification as a coroutine on a real
Dask worker's event loop (no thread, no second loop)."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from conftest import AGENT_CONFIG
from uni_agent.config import AgentConfigs, ConfigError
from uni_agent.grading import (
    Verification, check_reward_config, grade_in_sandbox, grader_for, known_graders, register_grader, verify_patch,
    verify_reference)
from uni_agent.grading import grader_names
from uni_agent.grading.swe_local import SweLocalGrader


@pytest.fixture
def own_registry(monkeypatch):
    """Graders registered in a test stay in that test."""
    monkeypatch.setattr(grader_names.GRADERS, "_entries", dict(grader_names.GRADERS._entries))


def _agent(reward: dict[str, Any], row: dict):
    """The agent of a bundled task's row, its reward changed to `reward`."""
    kwargs = json.loads(json.dumps(row["extra_info"]["tools_kwargs"]))
    kwargs["reward"] = {**kwargs["reward"], **reward}
    return AgentConfigs.load(AGENT_CONFIG).for_row("swe_agent", kwargs, "test")


def test_the_reward_types_of_today_are_registered():
    assert set(known_graders()) == {"swe_local", "swe_bench", "swe_smith", "terminal_bench"}
    for name in known_graders():
        assert grader_for(name).name == name


def test_an_unknown_reward_name_is_a_clear_error_naming_it_and_the_known_ones(rows):
    with pytest.raises(ConfigError) as caught:
        check_reward_config(_agent({"name": "swe_bnech"}, rows[0]), "rows row 3 (instance_id=x)")
    message = str(caught.value)
    assert message.startswith("rows row 3 (instance_id=x): reward.name 'swe_bnech' is not a known grader")
    assert all(name in message for name in known_graders())
    with pytest.raises(ConfigError, match="reward.name None is not a known grader"):
        grader_for(None)


@dataclass
class EchoGrader:
    """A grader of a new reward type: resolved when the answer contains the row's expected text."""

    name: str = "echo"
    required_metadata: tuple[str, ...] = ("expected",)
    solves_by_script: bool = False
    graded: list[str] = field(default_factory=list)

    def check_metadata(self, metadata):
        if not isinstance(metadata["expected"], str):
            raise ConfigError("expected must be a string")

    def time_limit(self, reward, oracle):
        return reward.eval_timeout

    async def grade(self, sandbox, agent, patch, outcome, oracle):
        self.graded.append(patch)
        outcome.patch_applied = True
        outcome.resolved = agent.reward.metadata["expected"] in patch
        outcome.reward = float(outcome.resolved)
        outcome.status = "resolved" if outcome.resolved else "unresolved"


def test_a_grader_registered_under_a_new_name_is_found_checked_and_used(own_registry, rows):
    echo = register_grader(EchoGrader())
    assert grader_for("echo") is echo and "echo" in known_graders()
    check_reward_config(_agent({"name": "echo", "metadata": {"expected": "42"}}, rows[0]), "here")
    with pytest.raises(ConfigError, match="^here: reward.metadata lacks 'expected'$"):
        check_reward_config(_agent({"name": "echo", "metadata": {}}, rows[0]), "here")
    with pytest.raises(ConfigError, match="^here: reward.metadata: expected must be a string$"):
        check_reward_config(_agent({"name": "echo", "metadata": {"expected": 42}}, rows[0]), "here")
    # verify_patch picks it by the row's reward.name, in a real (bubblewrap) sandbox of a bundled task.
    agent = _agent({"name": "echo", "metadata": {"expected": "42"}}, rows[0])

    async def both() -> list[Verification]:
        return await asyncio.gather(verify_patch(agent, "x = 42\n", "echo-yes"),
                                    verify_patch(agent, "x = 41\n", "echo-no"))

    answers = asyncio.run(both())
    assert [(v.status, v.reward) for v in answers] == [("resolved", 1.0), ("unresolved", 0.0)]
    assert sorted(echo.graded) == ["x = 41\n", "x = 42\n"]


@dataclass
class TypoGrader(EchoGrader):
    name: str = "typo"

    async def grade(self, sandbox, agent, patch, outcome, oracle):
        outcome.status, outcome.reward = "resolve", 1.0


def test_a_status_no_grader_may_write_is_a_grading_error_not_a_wrong_answer(own_registry, rows):
    register_grader(TypoGrader())
    outcome = asyncio.run(grade_in_sandbox(None, _agent({"name": "typo", "metadata": {"expected": "x"}}, rows[0])))
    assert outcome.status == "error" and "'resolve' is not a valid VerificationStatus" in outcome.error


def test_a_row_of_an_unknown_reward_is_graded_as_an_error_not_a_crash(rows):
    """A row that skipped the check (a stale agent config) still yields a Verification saying why."""
    agent = _agent({"name": "nope"}, rows[0])
    outcome = asyncio.run(verify_reference(agent, "gold"))
    assert outcome.status == "error" and "'nope' is not a known grader" in outcome.error


@dataclass
class LoopProbe(SweLocalGrader):
    """The real swe_local grader, noting which loop and thread it graded on."""

    name: str = "swe_local_probe"
    seen: list[dict[str, Any]] = field(default_factory=list)

    async def grade(self, sandbox, agent, patch, outcome, oracle):
        from distributed import get_worker

        worker = get_worker()
        self.seen.append({"loop_is_workers": asyncio.get_running_loop() is worker.loop.asyncio_loop,
                          "thread": threading.current_thread().name, "thread_id": threading.get_ident()})
        await super().grade(sandbox, agent, patch, outcome, oracle)


def test_verify_patch_runs_as_a_coroutine_on_the_workers_event_loop(own_registry, rows):
    """Submitted to a real LocalCluster worker, verify_patch runs on that worker's event loop, in the thread that
    runs the loop, not in the worker's thread pool with a loop of its own. (In-process workers, so the test can
    register a probe grader the worker sees; the task path in the worker is the same as for worker processes.)"""
    from distributed import Client, LocalCluster

    probe = register_grader(LoopProbe())
    row = rows[0]
    agent = _agent({"name": "swe_local_probe", "eval_timeout": 120}, row)
    gold = row["extra_info"]["tools_kwargs"]["reward"]["metadata"]["patch"]
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        loop_thread_id = client.run(threading.get_ident)  # a plain function given to run() runs on the loop
        future = client.submit(verify_patch, agent, gold, "probe-gold", pure=False)
        outcome: Verification = future.result(timeout=180)
    assert outcome.status == "resolved" and outcome.reward == 1.0, (outcome.error, outcome.log_tail[-2000:])
    [seen] = probe.seen
    assert seen["loop_is_workers"], seen
    assert seen["thread_id"] == next(iter(loop_thread_id.values())), seen
    assert "Dask-Default-Threads" not in seen["thread"], seen


def test_validating_rows_loads_no_agent_runtime():
    """dataset.py checks rows against the grader registry without loading the agent loop, its model client, the
    worker or the driver's cluster, pool and dispatch (checked in a fresh interpreter: this one has loaded everything
    already)."""
    import subprocess
    import sys

    code = "import sys, uni_agent.driver.dataset; print(' '.join(m for m in sys.modules if m.startswith('uni_agent')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "uni_agent.grading.grader_names" in loaded
    runtime = ("uni_agent.episode.agent_loop", "uni_agent.episode.conversation", "uni_agent.episode.worker",
               "uni_agent.llm", "uni_agent.driver.run", "uni_agent.driver.dispatch", "uni_agent.driver.pool",
               "uni_agent.driver.cluster")
    assert not [m for m in loaded if m.startswith(runtime)], loaded
