"""The Dask resources uni-agent's workers declare. A leaf module: the driver (which workers take sandboxes,
uni_agent.driver.cluster) and the worker preload (which workers warm a fork server) both read it."""

from __future__ import annotations

SANDBOX = "SANDBOX"  # what a sandbox worker declares: dask worker --resources SANDBOX=N
