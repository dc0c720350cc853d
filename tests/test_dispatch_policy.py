"""The dispatch policy alone: events in, decisions out, no cluster and no waiting (uni_agent.driver.policy).

The same rules run for real in tests/test_reliability_processes.py (workers killed under a run) and
tests/test_run_dask.py; here every branch is driven directly, including the clock."""

from __future__ import annotations

from uni_agent.driver.policy import (
    ACTOR_START_TIMEOUT, MIN_START_TIMEOUT, DispatchPolicy, Enough, GiveUp, NeedActor, NoWorkerCameBack, Replace,
    Retry, Send, StartActor, WaitForWorker,
)

W1, W2, W3 = "tcp://10.0.0.1:4000", "tcp://10.0.0.2:4000", "tcp://10.0.0.3:4000"


def two_actors(**kwargs) -> DispatchPolicy:
    policy = DispatchPolicy(actors_wanted=2, worker_wait_timeout=300, **kwargs)
    policy.actor_started("a0", W1)
    policy.actor_started("a1", W2)
    return policy


def test_first_actors_go_round_robin_over_the_sandbox_workers():
    assert DispatchPolicy(5, 300).initial_workers([W1, W2]) == [W1, W2, W1, W2, W1]
    assert DispatchPolicy(0, 300).initial_workers([W1, W2]) == [W1]  # at least one actor


def test_a_rollout_goes_to_the_least_busy_actor_first_started_on_a_tie():
    policy = two_actors()
    assert policy.next_step("r0") == Send("a0")
    assert policy.next_step("r1") == Send("a1")
    assert policy.next_step("r2") == Send("a0")
    policy.rollout_done("r0", "a0")
    policy.rollout_done("r2", "a0")
    assert policy.in_flight == {"a0": 0, "a1": 1}
    assert policy.next_step("r3") == Send("a0")


def test_a_failed_call_on_a_live_worker_is_retried_without_a_replacement():
    policy = two_actors()
    assert policy.next_step("r0") == Send("a0")
    assert policy.call_failed("r0", "a0", "ActorCallError: boom", live={W1, W2}) == Retry()
    assert policy.placed == {"a0": W1, "a1": W2}  # the actor stays: its worker is alive
    assert policy.in_flight["a0"] == 0
    assert policy.next_step("r0") == Send("a0")


def test_a_failed_call_on_a_lost_worker_replaces_the_actor():
    policy = two_actors()
    policy.next_step("r0")
    assert policy.call_failed("r0", "a0", "CommClosedError: lost", live={W2}) == Replace("a0")
    assert policy.drop("a0", live={W2}) == ["a0"]
    assert policy.placed == {"a1": W2}
    assert not policy.enough_actors()


def test_drop_also_takes_every_other_actor_on_a_gone_worker():
    policy = DispatchPolicy(actors_wanted=3, worker_wait_timeout=300)
    for name, worker in (("a0", W1), ("a1", W2), ("a2", W1)):
        policy.actor_started(name, worker)
    assert policy.drop("a0", live={W2}) == ["a0", "a2"]
    assert policy.drop(None, live={W2}) == []


def test_many_rollouts_noticing_one_loss_replace_it_once():
    policy = two_actors()
    for key in ("r0", "r1", "r2"):
        assert policy.next_step(key) in (Send("a0"), Send("a1"))
    assert policy.call_failed("r0", "a0", "lost", live={W2}) == Replace("a0")
    policy.drop("a0", live={W2})
    assert isinstance(policy.replacement_step([W2, W3], now=0.0), StartActor)
    policy.actor_started("a2", W3)
    # r2 also ran on a0: its failure names a0 again, which is gone; there are enough actors again, start none
    assert policy.call_failed("r2", "a0", "lost", live={W2, W3}) == Replace("a0")
    assert policy.drop("a0", live={W2, W3}) == []
    assert policy.enough_actors()


def test_a_rollout_runs_at_most_three_times_then_gives_up_with_the_last_error():
    policy = two_actors()
    for attempt in range(3):
        step = policy.next_step("r0")
        assert isinstance(step, Send)
        assert policy.call_failed("r0", step.actor, f"error {attempt}", live={W1, W2}) == Retry()
    assert policy.next_step("r0") == GiveUp("error 2")
    assert "r0" not in policy.errors
    assert policy.in_flight == {"a0": 0, "a1": 0}


def test_an_unreachable_actor_does_not_count_as_an_attempt():
    """Calls that failed because the actor could not be reached (its worker died; the scheduler may not know yet)
    interrupted the rollout: it runs again, whatever the number of attempts; the rollout's own failures still count."""
    policy = two_actors()
    for _ in range(5):  # more losses than attempts: each worker died under it, or the call found it dead
        step = policy.next_step("r0")
        assert isinstance(step, Send)
        assert policy.call_failed("r0", step.actor, "OSError: Unable to contact Actor's worker", live={W1, W2},
                                  unreachable=True) == Retry()
    assert isinstance(policy.next_step("r0"), Send)
    assert policy.errors == {} and len(policy.losses["r0"]) == 5
    policy.rollout_done("r0", "a0")
    assert policy.losses == {}


def test_a_rollout_that_keeps_losing_its_worker_gives_up_at_the_larger_bound():
    policy = two_actors(losses_allowed=4)
    for attempt in range(4):
        step = policy.next_step("r0")
        policy.call_failed("r0", step.actor, f"lost {attempt}", live={W1, W2}, unreachable=True)
    assert policy.next_step("r0") == GiveUp("its agent worker could not be reached 4 times; last: lost 3")
    assert policy.losses == {} and policy.errors == {}


def test_a_success_after_failures_forgets_them():
    policy = two_actors(attempts=2)
    policy.call_failed("r0", policy.next_step("r0").actor, "boom", live={W1, W2})
    policy.rollout_done("r0", policy.next_step("r0").actor)
    assert policy.errors == {}
    policy.call_failed("r0", policy.next_step("r0").actor, "boom", live={W1, W2})
    assert isinstance(policy.next_step("r0"), Send)  # a fresh count: one failure of two allowed


def test_no_actor_left_asks_for_one_before_anything_runs():
    policy = DispatchPolicy(actors_wanted=1, worker_wait_timeout=300)
    assert policy.next_step("r0") == NeedActor()
    assert policy.in_flight == {}


def test_a_replacement_goes_to_the_live_worker_holding_the_fewest_actors():
    policy = DispatchPolicy(actors_wanted=4, worker_wait_timeout=300)
    for name, worker in (("a0", W1), ("a1", W1), ("a2", W2)):
        policy.actor_started(name, worker)
    policy.replacement_begins(now=100.0)
    assert policy.replacement_step([W1, W2, W3], now=100.0) == StartActor(W3, ACTOR_START_TIMEOUT)
    assert policy.replacement_step([W1, W2], now=100.0).worker == W2


def test_a_replacement_start_is_bounded_by_what_is_left_of_the_wait():
    policy = DispatchPolicy(actors_wanted=1, worker_wait_timeout=30)
    policy.replacement_begins(now=0.0)
    assert policy.replacement_step([W1], now=10.0) == StartActor(W1, 20.0)
    assert policy.replacement_step([W1], now=29.0) == StartActor(W1, MIN_START_TIMEOUT)


def test_with_no_worker_the_policy_waits_then_gives_up_the_run():
    policy = DispatchPolicy(actors_wanted=2, worker_wait_timeout=30)
    policy.replacement_begins(now=0.0)
    assert policy.replacement_step([], now=1.0) == WaitForWorker()
    assert policy.start_failed(now=29.0) == WaitForWorker()
    assert policy.replacement_step([], now=31.0) == NoWorkerCameBack()


def test_a_failed_start_carries_on_with_the_actors_left():
    policy = two_actors()
    policy.drop("a0", live={W2})
    policy.replacement_begins(now=0.0)
    assert policy.start_failed(now=1.0) == Enough()
    assert policy.replacement_step([], now=1000.0) == Enough()  # never gives up while an actor is left


def test_a_run_where_a_worker_dies_ends_every_rollout_exactly_once():
    """A whole run, driven as the dispatcher drives it: 20 rollouts on two actors, W1 dies after its first rollout
    fails, a replacement starts on W3; every rollout finishes once, none on the dead worker after the loss."""
    policy = two_actors()
    alive = {W1, W2}
    finished: dict[str, str] = {}
    pending = [f"r{i}" for i in range(20)]
    sent = [(key, policy.next_step(key)) for key in pending]
    for key, step in sent:
        assert isinstance(step, Send)
        if policy.placed.get(step.actor) == W1 or step.actor not in policy.placed:
            alive.discard(W1)
            decision = policy.call_failed(key, step.actor, "CommClosedError", live=alive)
            assert decision == Replace(step.actor)
            policy.drop(decision.actor, live=alive)
            if not policy.enough_actors():
                policy.replacement_begins(now=0.0)
                start = policy.replacement_step([W2, W3], now=0.0)  # W3 joined the cluster meanwhile
                assert start == StartActor(W3, ACTOR_START_TIMEOUT)
                policy.actor_started("a2", W3)
                alive.add(W3)
            again = policy.next_step(key)
            assert isinstance(again, Send) and policy.placed[again.actor] != W1
            policy.rollout_done(key, again.actor)
            finished[key] = policy.placed[again.actor]
        else:
            policy.rollout_done(key, step.actor)
            finished[key] = policy.placed[step.actor]
    assert sorted(finished) == sorted(pending)
    assert W1 not in finished.values()
    assert set(policy.placed) == {"a1", "a2"} and policy.errors == {}
    assert set(policy.in_flight.values()) == {0}
