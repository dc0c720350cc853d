"""The episode envelope with a strategy of the test's own (the agent protocol, uni_agent.episode.strategy), and the
typed rollout record: its Parquet row (real Parquet through the ResultStore), its enums and endings. The sandbox is
a FakeSandbox (an in-memory test double, uni_agent/testing/fake_sandbox.py); the one session test reads a real
Session over a stream that ends as a launcher without python3 ends it."""

import asyncio
import dataclasses
import json

import pyarrow.parquet as pq
import pytest
import yaml

from conftest import AGENT_CONFIG, REPO_ROOT
from uni_agent.config import deep_merge, validate_agent
from uni_agent.driver.results import RESULT_SCHEMA, ResultStore
from uni_agent.episode.ending import Ending, EpisodeEnd
from uni_agent.episode.envelope import run_episode
from uni_agent.episode.exit_reason import EXIT_REASONS, ExitReason
from uni_agent.episode.failures import FailedPart, FailureKind
from uni_agent.episode.rollout import RolloutResult, RolloutSpec
from uni_agent.episode.strategy import Episode
from uni_agent.events import RolloutState, rollout_event
from uni_agent.grading import Verification
from uni_agent.harness import HarnessAgent
from uni_agent.episode.agent_loop import UniAgentLoop, strategy_for
from uni_agent.sandbox import SandboxStartError
from uni_agent.sandbox.session import ImageWithoutPython, Session
from uni_agent.sandbox.supervisor_launch import NO_PYTHON
from uni_agent.testing.fake_sandbox import FakeSandbox, opener

PATCH = "diff --git a/x b/x\n"


def _agent(**overrides):
    (example,) = yaml.safe_load(AGENT_CONFIG.read_text())
    return validate_agent(deep_merge(example, {"env": {"deployment": {"repo": str(REPO_ROOT)}}, **overrides}),
                          "record test agent")


def _spec(agent):
    return RolloutSpec(run_id="rec", instance_id="task", rollout=0, data_source="unit", row_index=0,
                       prompt=[{"role": "user", "content": "Do it."}], agent=agent)


class OneCommand:
    """A strategy of our own: runs `command` once, then ends as it says (the envelope does everything else)."""

    grace_s = 0.0

    def __init__(self, agent, command="echo hi", then=None):
        self.agent, self.command, self.then = agent, command, then
        self.output = None

    def sandbox_config(self):
        return self.agent

    def time_limit(self):
        return None

    async def act(self, episode: Episode) -> Ending:
        sandbox = await episode.sandbox.ready()
        episode.row.num_turns = 1
        self.output = (await sandbox.exec(self.command, 5)).output
        if isinstance(self.then, BaseException):
            raise self.then
        if self.then == "sleep":
            await asyncio.sleep(10)
        return self.then or Ending(ExitReason.SUBMITTED)

    def record(self, row):
        row.messages = [{"role": "tool", "content": f"{self.output} key sk-abcdefghijklmnop1234"}]


def _episode(strategy, sandbox, agent):
    events = []
    result = asyncio.run(run_episode(strategy, _spec(agent), model=None, emit=events.append,
                                     open_sandbox=opener(sandbox)))
    return result, events


def test_any_strategy_gets_the_envelope_patch_close_redaction_classification_and_mask():
    agent = _agent(mask_abnormal_exit_traj=True, env={"post_setup_cmd": "setup", "deployment": {"repo": "."}})
    sandbox = FakeSandbox(lambda command: "ok", patch=PATCH)
    strategy = OneCommand(agent, then=Ending(ExitReason.PROGRAM_FAILED, "exit 3"))
    result, events = _episode(strategy, sandbox, agent)
    assert sandbox.commands[:2] == ["setup", "echo hi"] and sandbox.closed and result.patch == PATCH
    assert (result.exit_reason, result.error) == (ExitReason.PROGRAM_FAILED, "exit 3")
    assert (result.failure_kind, result.failure_cause) == (FailureKind.MODEL, "program_failed")
    assert result.masked and result.messages == [{"role": "tool", "content": "ok key sk-***"}]  # redacted
    assert [e["state"] for e in events] == ["starting_sandbox"]


@pytest.mark.parametrize(("then", "reason", "cause"), [
    (EpisodeEnd(Ending(ExitReason.COMMAND_TIMEOUTS, "too many")), ExitReason.COMMAND_TIMEOUTS, "command_timeouts"),
    (OSError("disk gone"), ExitReason.ERROR, "sandbox: OSError: disk gone"),
    (Ending(ExitReason.ERROR, "it broke", FailedPart.HARNESS), ExitReason.ERROR, "harness: it broke"),
    ("sleep", ExitReason.WALL_CLOCK, "wall_clock"),
])
def test_endings_that_are_exceptions_values_or_the_clock(then, reason, cause):
    agent = _agent(interaction={"episode_timeout": 0.3})
    sandbox = FakeSandbox(lambda command: "ok")
    result, _ = _episode(OneCommand(agent, then=then), sandbox, agent)
    assert result.exit_reason == reason and result.failure_cause == cause and sandbox.closed


def test_a_start_that_fails_is_the_sandboxs_infra_failure_and_nothing_is_left_open():
    agent = _agent()

    async def broken(agent, name):
        raise SandboxStartError("never up")

    result = asyncio.run(run_episode(OneCommand(agent), _spec(agent), model=None, open_sandbox=broken))
    assert result.failure_kind == FailureKind.INFRA and result.failure_cause == "sandbox: SandboxStartError: never up"


def test_the_agent_config_names_its_strategy_and_a_class_that_is_not_one_is_refused():
    assert isinstance(strategy_for(_agent()), UniAgentLoop)
    harness = _agent(_target_="uni_agent.harness.HarnessAgent", harness={"command": "true"})
    assert isinstance(strategy_for(harness), HarnessAgent)
    with pytest.raises(TypeError, match="is not an agent strategy"):
        strategy_for(_agent(_target_="uni_agent.episode.conversation.Conversation"))


def test_the_row_keeps_the_columns_and_strings_readers_know(tmp_path):
    assert RESULT_SCHEMA.names == [f.name for f in dataclasses.fields(RolloutResult)]
    result = RolloutResult(run_id="r", instance_id="t", rollout=0, data_source="d", agent_name="a",
                           exit_reason="wall_clock", messages=[{"role": "user", "content": "é"}],
                           token_drift={"turn": 2, "position": 5, "expected": 1, "got": 2},
                           chains=[{"chain": 0, "calls": 3}], harness={"exit_code": 0, "output_tail": "ü"})
    result.record(Verification(status="unresolved", log="the whole log"))
    assert result.failure_kind is FailureKind.MODEL and result.verification.status == "unresolved"
    store = ResultStore(tmp_path)
    store.add(result)
    store.flush()
    (part,) = (tmp_path / "results").glob("part-*.parquet")
    assert pq.read_schema(part).remove_metadata().equals(RESULT_SCHEMA)
    row = store.read().iloc[0]
    assert (row.exit_reason, row.failure_kind, row.failure_cause) == ("wall_clock", "model", "wall_clock")
    assert json.loads(row.messages) == [{"role": "user", "content": "é"}] and '"é"' in row.messages
    assert json.loads(row.verification)["status"] == "unresolved" and "lost" not in json.loads(row.verification)
    assert "log" not in json.loads(row.verification)  # the file keeps the whole log, never the row
    assert json.loads(row.token_drift)["turn"] == 2 and json.loads(row.chains)[0]["calls"] == 3
    assert json.loads(row.harness)["output_tail"] == "ü" and row.attempts == "[]"
    ungraded = RolloutResult(run_id="r", instance_id="u", rollout=0, data_source="d", agent_name="a",
                             exit_reason="submitted").row()
    assert ungraded["verification"] == "{}" and ungraded["token_drift"] is None and ungraded["harness"] is None


def test_enums_are_the_strings_and_unknown_values_are_refused():
    with pytest.raises(ValueError):
        RolloutResult(run_id="r", instance_id="t", rollout=0, data_source="d", agent_name="a", exit_reason="nope")
    assert ExitReason.CANCELLED == "cancelled" and "cancelled" not in EXIT_REASONS  # an event's end, no row's
    event = rollout_event("r", "t", 0, RolloutState.FAILED, exit_reason=ExitReason.CANCELLED)
    assert type(event["state"]) is str and type(event["exit_reason"]) is str and event["state"] == "failed"


@pytest.mark.parametrize(("said", "kind"), [(NO_PYTHON, ImageWithoutPython), ("exit status 1", SandboxStartError)])
def test_an_image_without_python_is_a_type_the_start_does_not_retry(said, kind):
    async def main():
        reader = asyncio.StreamReader()
        reader.feed_eof()  # the launcher exited before the supervisor said ready

        async def write(data):
            return None

        async def describe_end():
            return f"exit status 127; stderr: {said}"

        with pytest.raises(kind) as raised:
            await Session("box", reader, write, describe_end).wait_ready(5)
        return raised.value

    error = asyncio.run(main())
    assert said in str(error) and (kind is SandboxStartError) == isinstance(error, SandboxStartError)


def test_what_crosses_the_actor_boundary_is_a_typed_outcome():
    import pickle

    from uni_agent.episode.rollout import Finished, Raised, RolloutRaised

    row = RolloutResult(run_id="r", instance_id="t", rollout=0, data_source="d", agent_name="a",
                        exit_reason="submitted", verification=Verification(status="resolved", resolved=True))
    done, raised = pickle.loads(pickle.dumps([Finished(row.key, row), Raised(("t", 1), "ValueError: boom")]))
    assert done.unwrap().verification.status == "resolved" and done.unwrap().exit_reason is ExitReason.SUBMITTED
    with pytest.raises(RolloutRaised, match="^ValueError: boom$"):
        raised.unwrap()


def test_the_conversation_crosses_as_json_text_and_is_parsed_only_when_read(tmp_path):
    import pickle

    messages = [{"role": "user", "content": "é"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}]
    sent = RolloutResult(run_id="r", instance_id="t", rollout=0, data_source="d", agent_name="a",
                         exit_reason="submitted", messages=messages)
    arrived = pickle.loads(pickle.dumps(sent, protocol=5))
    assert "messages" not in vars(arrived)  # not parsed on arrival: the driver writes the text as it came
    store = ResultStore(tmp_path)
    store.add(arrived)
    store.flush()
    assert json.loads(store.read().iloc[0].messages) == messages and "messages" not in vars(arrived)
    assert arrived.messages == messages and arrived == sent  # parsed when read, equal to what was sent
    arrived.messages.append({"role": "note", "content": "added on the driver"})  # read, then changed: encoded anew
    assert json.loads(arrived.row()["messages"])[-1]["content"] == "added on the driver"
    assert "_messages_text" not in arrived.row() and arrived.row().keys() == sent.row().keys()
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        arrived.nothing  # noqa: B018 - any other missing attribute is still an AttributeError
