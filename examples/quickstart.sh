#!/usr/bin/env bash
# One command: set up, then run every bundled task x 2 rollouts with the embedded defaults
# (LocalCluster, bubblewrap sandboxes, llama.cpp + SmolLM2-135M on the CPU). Extra flags go to parallel_infer.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash examples/setup.sh
exec .venv/bin/python examples/agent_interaction/parallel_infer.py --n 2 --max-tokens 256 --output-dir outputs/quickstart "$@"
