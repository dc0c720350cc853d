#!/usr/bin/env bash
# One command: set up, then run the whole test suite (including the real llama.cpp end-to-end test).
set -euo pipefail
cd "$(dirname "$0")/.."
bash examples/setup.sh
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
