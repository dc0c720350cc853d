"""Python's full garbage collections, made rare in the processes that hold thousands of rollouts at once.

An agent worker's heap is mostly its rollouts in flight: long-lived, and churning at every turn, because a turn's
request objects (the coroutines, the aiohttp request, its timers) live as long as the model call, seconds, so they
reach the oldest generation and then die by reference count. With Python's default thresholds (700, 10, 10) every
tenth middle-generation pass may walk the whole heap (when the old generation grew by a quarter since the last walk,
which that churn keeps true). Measured with `uni-agent bench --simulate --in-flight 4000 --workers 1`: 19 full
collections took 7.3 s of the worker's 21 s of CPU, each pausing its event loop up to 0.66 s (every rollout of the
worker waits through it), at 0.90 of ideal; with the third threshold at 1,000 there were none in the 106 s run, the
worker used 11.8 s and the run reached 0.95.

Only the full walk waits longer: young collections and reference counting go on as before, and a full walk still
comes after 1,000 middle-generation passes (that run made 264 in 106 s: one full walk in about 7 minutes), so cyclic
garbage is still freed; the worker's peak memory stayed the same (273 -> 274 MiB).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Middle-generation passes between two full collections (Python's default is 10).
MIDDLE_PASSES_PER_FULL_COLLECTION = 1000


def make_full_collections_rare() -> None:
    """Raise the oldest generation's threshold in this process; young thresholds stay, and so does a disabled gc."""
    young, middle, oldest = gc.get_threshold()
    if young == 0 or not gc.isenabled():  # the user turned collection off: not ours to turn back on
        return
    gc.set_threshold(young, middle, max(oldest, MIDDLE_PASSES_PER_FULL_COLLECTION))


@contextlib.contextmanager
def full_collections_rare() -> Iterator[None]:
    """make_full_collections_rare for a block, then the thresholds as they were: a run called from the user's own
    script (uni_agent.run, the rollout service) leaves their process's collector as it found it."""
    before = gc.get_threshold()
    make_full_collections_rare()
    try:
        yield
    finally:
        gc.set_threshold(*before)
