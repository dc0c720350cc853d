"""Helpers for tests and benchmarks.

scripted_llm.py: a real OpenAI-compatible HTTP server whose replies come from a Python function (drives the whole
system: HTTP client, parsing, tools, sandboxes, Dask). fake_sandbox.py: a test double for the agent loop's sandbox
(in memory, commands answered by a function), for fast unit tests of the loop; integration tests use real sandboxes."""
