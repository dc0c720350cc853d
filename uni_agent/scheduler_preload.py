"""uni-agent's scheduler extension, loaded with `dask scheduler --preload uni_agent.scheduler_preload`.

It installs the GPU lease table (uni_agent.placement.GpuLeases) when the scheduler starts, so every driver that
connects shares one record of which GPU devices hold an engine. Drivers also register it themselves when it is
missing, so the preload is recommended, not required.
"""

from __future__ import annotations

from typing import Any

from .placement import GpuLeases


def dask_setup(scheduler: Any) -> None:
    scheduler.add_plugin(GpuLeases(), idempotent=True)
