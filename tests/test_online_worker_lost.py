"""An agent worker killed -9 while update_weights switches a replica, on the real parts: the session's LocalCluster
(worker processes under nannies: the killed one comes back under a new address), a real llama-server (SmolLM2), real
sandboxes, and the stand-in trainer's perturbed GGUF as the new weights (see test_online_service.py).

What the service promises (uni_agent/online/pool.py, weights.py): an update never waits on a dead worker; a lost
worker's rollouts run again elsewhere and are delivered once; a worker started during or after the update stamps the
version that serves, and takes no call to a replica while it switches."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from conftest import poll_until
from test_online_service import _calls_done, _sampled_versions, loop, running_service, weights  # noqa: F401 - fixtures
from uni_agent.sandbox.local import reap_orphaned_sandboxes, sandbox_root

pytestmark = pytest.mark.llm


@pytest.fixture(scope="module")
def service(dask_client, loop, tmp_path_factory):  # noqa: F811 - loop is the imported fixture
    """Two agent workers (one per dask worker), rollouts of up to 10 turns: long enough to be in flight across an
    update on two shared cores."""
    yield from running_service(dask_client, loop, tmp_path_factory.mktemp("lost"), agent_workers=2, max_turns=10)


def _engine_worker(dask_client) -> str:
    """The dask worker holding the llama-server actor (killing it would take the engine too: not this test)."""
    def holders(dask_scheduler):
        return [ws.address for key, ts in dask_scheduler.tasks.items()
                if str(key).startswith("llama-server-") for ws in ts.who_has]
    (worker,) = dask_client.run_on_scheduler(holders)
    return worker


def _load(loop, actor) -> dict:  # noqa: F811 - loop is the fixture's LoopThread
    """One agent worker's view of the replicas: its rollouts, calls, pause and version on each."""
    async def ask() -> dict:
        return await actor.handle.replica_load()
    return loop.run(ask(), timeout=60)


def _batch_paused_with_rollouts_on(loop, service, weights, rows, victim, survivor, attempts=3):  # noqa: F811
    """A batch whose rollouts have answers of the serving version v on both agent workers, then update_weights to
    v+1 started and the replica paused while `victim` still has a rollout in flight. A model that submits after a
    turn or two can end the victim's rollouts first: then the update and the batch finish, and another batch is
    tried. Returns v, the batch, the update's concurrent future, how many rollouts the victim had and when that
    was counted."""
    url = service.engines.urls[0]
    for _ in range(attempts):
        v = service.version
        path, done = weights(v + 1), _calls_done(loop, service)  # the file first: writing it delays the update
        batch = loop.run(service.submit(rows[:3], n=2))
        poll_until(lambda: _calls_done(loop, service) > done and _load(loop, victim)[url]["rollouts"]  # noqa: B023
                   and _load(loop, survivor)[url]["rollouts"], 300, "rollouts answered on both agent workers")
        update = asyncio.run_coroutine_threadsafe(service.update_weights(v + 1, path, drain_timeout=120), loop.loop)
        poll_until(lambda: _load(loop, survivor)[url]["paused"] or update.done(), 120,  # noqa: B023
                   "the replica's pause")
        counted_at = time.time()
        on_victim = _load(loop, victim)[url]["rollouts"]
        if on_victim and not update.done():
            return v, batch, update, on_victim, counted_at
        update.result(timeout=300)
        loop.run(batch.results(), timeout=600)
    raise AssertionError(f"the victim had no rollout in flight during an update in {attempts} batches")


def test_an_agent_worker_killed_during_an_update_loses_no_rollout(loop, service, weights, rows, dask_client):  # noqa: F811
    url = service.engines.urls[0]
    engine_worker = _engine_worker(dask_client)
    assert len(service.pool.actors) == 2
    victim = next(a for a in service.pool.actors.values() if a.worker != engine_worker)
    survivor = next(a for a in service.pool.actors.values() if a is not victim)
    victim_pid = dask_client.run(os.getpid, workers=[victim.worker])[victim.worker]

    v, batch, update, on_victim, counted_at = _batch_paused_with_rollouts_on(loop, service, weights, rows, victim,
                                                                                  survivor)
    killed_at = time.time()
    os.kill(victim_pid, signal.SIGKILL)

    report = update.result(timeout=300)  # never waits on the dead worker (a TimeoutError here if it does)
    assert report.version == v + 1 and service.version == v + 1
    results = loop.run(batch.results(), timeout=600)

    # Every rollout of the batch exactly once, none failed for the lost worker.
    assert sorted((r.instance_id, r.rollout) for r in results) == sorted(s.key for s in batch.specs)
    infra = [(r.instance_id, r.rollout, r.error) for r in results if r.failure_kind == "infra"]
    assert not infra, infra
    service.store.flush()
    stored = service.store.read()
    keys = list(zip(stored.instance_id, stored.rollout.astype(int)))
    assert all(keys.count(k) == 1 for k in batch.tasks), "a rollout of the batch is not recorded exactly once"

    # Versions in order on every row; the rollouts the kill interrupted ran again from the start, after the pause
    # began: each of their sampled tokens is the new weights'.
    for row in results:
        versions = _sampled_versions(row)
        assert versions == sorted(versions) and set(versions) <= {v, v + 1}, (row.instance_id, row.rollout)
    rerun = [r for r in results if r.started_at > killed_at]
    # A rollout counted in flight on the victim may still have ended there before the kill (its reply came before
    # the pause; its result was collected): the kill did not interrupt it, and it is not run again.
    ended_first = [r for r in results if r.worker == victim.worker and r.finished_at >= counted_at]
    assert len(rerun) >= on_victim - len(ended_first), [
        (r.instance_id, r.rollout, r.worker, r.started_at, r.finished_at) for r in results]
    for row in rerun:
        assert set(_sampled_versions(row)) == {v + 1}, (row.instance_id, row.rollout, row.token_versions)

    # The lost worker was replaced, and every agent worker (the replacement too) serves the new version, unpaused.
    assert victim.name not in service.pool.actors and len(service.pool.actors) == 2
    for actor in service.pool.actors.values():
        assert _load(loop, actor)[url]["version"] == v + 1 and not _load(loop, actor)[url]["paused"], actor.name
    assert loop.run(service.stats())["engines"][url]["version"] == v + 1

    # A worker killed -9 leaves its sandbox dirs to the next sandbox start's reap; none may follow here.
    reap_orphaned_sandboxes(sandbox_root())
