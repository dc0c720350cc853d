"""Helpers for tests and benchmarks that exercise the real system (real HTTP, real sandboxes, real Dask)."""
