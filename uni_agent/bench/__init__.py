"""`uni-agent bench`: how much the framework costs per turn and how well it keeps an endpoint and sandboxes busy.

A latency-controlled OpenAI-compatible endpoint (endpoint.py), the workload on uni-agent (ours.py) and on
mini-swe-agent's batch runner (peer.py), CPU/memory/limit helpers (measure.py), the sweep and table (main.py).
"""
