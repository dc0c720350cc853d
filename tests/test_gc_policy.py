"""Full garbage collections made rare (uni_agent.gc_policy) in the processes that hold many rollouts.

Each check runs in a fresh interpreter: the thresholds are process-wide, and pytest's own process must keep Python's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from uni_agent.driver.session import open_session
from uni_agent.settings import load_settings

REPO = Path(__file__).resolve().parent.parent

# A long-lived heap (the rollouts in flight) and a churn of objects that outlive a few young collections and then die
# by reference count (a turn's request objects during its model call): what makes Python walk the whole heap again
# and again. Prints how many full (generation 2) collections ran.
CHURN = textwrap.dedent("""
    import gc, json, sys
    sys.path.insert(0, {repo!r})
    if {rare}:
        from uni_agent.gc_policy import make_full_collections_rare
        make_full_collections_rare()
    full = [0]
    gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2
                        and full.__setitem__(0, full[0] + 1))
    heap = [{{"rollout": i, "messages": [[i]]}} for i in range(100_000)]
    for turn in range(20):  # every rollout's request objects of a turn, alive together, then gone together
        in_flight = [{{"turn": turn, "args": [i]}} for i in range(20_000)]
    print(json.dumps({{"full": full[0], "threshold": gc.get_threshold()}}))
""")


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_churn_of_a_rollout_heap_walks_it_again_and_again_by_default_and_rarely_with_the_policy():
    default = _run(CHURN.format(repo=str(REPO), rare=False))
    rare = _run(CHURN.format(repo=str(REPO), rare=True))
    assert default["threshold"] == [700, 10, 10]
    assert default["full"] >= 5, default  # what the policy is for: without it the heap is walked over and over
    assert rare["threshold"] == [700, 10, 1000]
    assert rare["full"] <= 1, rare


def test_a_disabled_or_stricter_collector_is_left_as_the_user_set_it():
    code = textwrap.dedent(f"""
        import gc, json, sys
        sys.path.insert(0, {str(REPO)!r})
        from uni_agent.gc_policy import make_full_collections_rare
        seen = {{}}
        gc.set_threshold(700, 10, 5000); make_full_collections_rare(); seen["higher"] = gc.get_threshold()
        gc.set_threshold(0); make_full_collections_rare(); seen["zero"] = gc.get_threshold()
        gc.set_threshold(700, 10, 10); gc.disable(); make_full_collections_rare()
        seen["disabled"] = [gc.get_threshold(), gc.isenabled()]
        print(json.dumps(seen))
    """)
    seen = _run(code)
    assert seen["higher"] == [700, 10, 5000]
    assert seen["zero"][0] == 0
    assert seen["disabled"] == [[700, 10, 10], False]


def test_an_agent_worker_sets_it():
    code = textwrap.dedent(f"""
        import gc, json, sys, tempfile
        sys.path.insert(0, {str(REPO)!r})
        from uni_agent.episode.worker import AgentWorker
        before = gc.get_threshold()
        AgentWorker(["http://127.0.0.1:9"], "model", None, {{}}, 5.0, tempfile.mkdtemp())
        print(json.dumps({{"before": before, "after": gc.get_threshold()}}))
    """)
    seen = _run(code)
    assert seen["before"] == [700, 10, 10] and seen["after"] == [700, 10, 1000]


def test_a_driver_session_holds_it_and_gives_the_process_back_as_it_was(tmp_path):
    """A run called from the user's own script changes their collector only while it runs (a real LocalCluster)."""
    before = gc.get_threshold()
    inside: list[tuple[int, int, int]] = []

    async def session() -> None:
        async with open_session(load_settings(local_workers=1, dashboard=False), tmp_path / "logs", agents=False):
            inside.append(gc.get_threshold())

    asyncio.run(session())
    assert inside == [(before[0], before[1], max(before[2], 1000))]
    assert gc.get_threshold() == before
