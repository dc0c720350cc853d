"""A rollout that ran out of time while every engine was down (exit reason engine_down: the outage's time, not the
model's) runs again within the same run, a bounded number of times; any other ending is kept as it is."""

from types import SimpleNamespace

from uni_agent.driver.run import rerun_engine_outages
from uni_agent.episode.exit_reason import ExitReason


def test_an_outage_is_run_again_at_most_the_limit_and_nothing_else_is():
    review = rerun_engine_outages(limit=2)
    waited, slow = SimpleNamespace(key=("task-1", 0)), SimpleNamespace(key=("task-2", 0))
    down = SimpleNamespace(exit_reason=ExitReason.ENGINE_DOWN)
    assert [review(waited, down) for _ in range(3)] == [True, True, False]
    assert review(SimpleNamespace(key=("task-1", 1)), down)  # the count is per rollout
    for reason in (ExitReason.WALL_CLOCK, ExitReason.SUBMITTED, ExitReason.ERROR):
        assert not review(slow, SimpleNamespace(exit_reason=reason))
