#!/usr/bin/env bash
# One command: set up, then run the whole test suite (including the real llama.cpp end-to-end test).
set -euo pipefail
cd "$(dirname "$0")/.."
bash examples/setup.sh
# The RL trainer's test (tests/test_rl_train_step.py) needs the `train` extra (torch, transformers): installed only
# where torch is one of this machine's local wheels (about a minute with the rest), else that test skips, saying why.
if .venv/bin/pip install -q --no-index --no-deps --dry-run --ignore-installed "torch==2.13.0" >/dev/null 2>&1; then
  TRAIN=$(.venv/bin/python -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))
          ['project']['optional-dependencies']['train']))")
  .venv/bin/pip install -q $TRAIN || echo "the train extra did not install: the RL trainer's test skips"
fi
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
