"""Builds llama.cpp's own `llama-server` once per machine, from a pinned source a registry package ships.

The source is the llama.cpp tree vendored in the `llama-cpp-python` sdist on PyPI (pinned below): `pip download`
fetches it like any other dependency, so no step reaches anything but the package registry. The build is cached
under ~/.cache/uni-agent/llama.cpp/<version>-<variant>-<recipe>-<hash of its flags>/ (UNI_AGENT_LLAMA_DIR moves it):
a change of flags builds anew beside the old build instead of reusing a binary made some other way.

Variants:
* `cpu`: portable x86-64 with AVX2 (never -march=native: a native build crashed with a protection fault on a host
  whose CPU advertises AMX), so one cached binary runs on every AVX2 machine of a cluster with a shared home.
* `cuda`: `-DGGML_CUDA=ON` for the compute capabilities of the GPUs of the machine that builds it.

Recipes (the same server either way; cluster/build_bench.py builds both side by side and times them):
* `quick` (the default): the tensor kernels (ggml) and the per-token code of libllama (grammar, sampler, vocabulary,
  batch, graph, KV cache) at -O3 as upstream has them; everything that runs once per request or once per process
  (HTTP, JSON, chat templates, argument parsing, the multimodal library, model loading) at -O1, its many small files
  compiled together (CMake unity builds), and no warning flags. These flags are set from outside the source tree
  (QUICK_CMAKE, included after the project() call), so the pinned source stays as shipped.
* `plain`: upstream's Release build, every file alone at -O3 (what this module built before the quick recipe).

Each step (download, unpack, configure, build, check) writes its own log; a failed step is a LlamaBuildError naming
the step and its log. `python -m uni_agent.engines.llama_build [--variant cpu|cuda|auto]` builds and prints the path;
it needs only the standard library, so setup runs it as a script while pip is still installing the package.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SOURCE_PACKAGE = "llama-cpp-python"
SOURCE_VERSION = "0.3.36"  # vendors llama.cpp 0c1e570 (2026-10-01)
VARIANTS = ("cpu", "cuda")
RECIPES = ("quick", "plain")
DEFAULT_RECIPE = "quick"

COMMON_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary, movable with its cache dir
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_SERVER=ON",
    # No web UI: the build would otherwise try npm or a download for it; the API is all we use.
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
]
CPU_FLAGS = [
    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_AVX512=OFF",
    "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
]
# The quick recipe's flags: -O1 for everything by default (QUICK_CMAKE raises the hot code back to -O3), no warnings.
QUICK_FLAGS = ["-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG", "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
               "-DLLAMA_ALL_WARNINGS=OFF", "-DGGML_ALL_WARNINGS=OFF", "-DGGML_CCACHE=OFF"]
# Included after each project() call (CMAKE_PROJECT_INCLUDE); acts once, deferred to the end of the top-level
# CMakeLists, when every target exists. A source or target property set here wins over the -O1 default because
# CMake puts target and source options after CMAKE_<LANG>_FLAGS_RELEASE on the command line (the last -O counts).
QUICK_CMAKE = """\
include_guard(GLOBAL)
if(CMAKE_VERSION VERSION_LESS 3.19)
  message(FATAL_ERROR "the quick llama-server build needs CMake 3.19 or newer (cmake_language DEFER); "
                      "install a newer cmake (pip install cmake) or build with --recipe plain")
endif()
function(uni_agent_quick_build)
  # The tensor kernels: the tokens/s.
  foreach(target ggml-base ggml-cpu ggml)
    if(TARGET ${target})
      target_compile_options(${target} PRIVATE -O3)
    endif()
  endforeach()
  # libllama's code that runs for every token (sampling under a grammar, the batch, the graph, the KV cache).
  set(hot llama-grammar.cpp llama-sampler.cpp llama-vocab.cpp unicode.cpp llama-context.cpp llama-graph.cpp
          llama-batch.cpp llama-kv-cache.cpp)
  list(TRANSFORM hot PREPEND "${CMAKE_SOURCE_DIR}/src/")
  set_source_files_properties(${hot} DIRECTORY "${CMAKE_SOURCE_DIR}/src" PROPERTIES COMPILE_OPTIONS -O3)
  set_source_files_properties("${CMAKE_SOURCE_DIR}/common/sampling.cpp" DIRECTORY "${CMAKE_SOURCE_DIR}/common"
                              PROPERTIES COMPILE_OPTIONS -O3)
  # Libraries of many small files that each parse the same large headers (nlohmann/json, the chat parsers).
  # Files that cannot share a unit: json.cpp specializes templates other files instantiate; mtmd-helper*.cpp check
  # (#error) that nothing before them included mtmd's internal headers.
  set_source_files_properties("${CMAKE_SOURCE_DIR}/common/json.cpp" DIRECTORY "${CMAKE_SOURCE_DIR}/common"
                              PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  set_source_files_properties("${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp"
                              "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp"
                              DIRECTORY "${CMAKE_SOURCE_DIR}/tools/mtmd" PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  foreach(target llama-common mtmd server-context llama-server-impl)
    if(TARGET ${target})
      set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    endif()
  endforeach()
endfunction()
cmake_language(DEFER CALL uni_agent_quick_build)
"""


class LlamaBuildError(RuntimeError):
    """A build step failed; the message names the step and its log."""


def cache_root() -> Path:
    return Path(os.environ.get("UNI_AGENT_LLAMA_DIR") or Path.home() / ".cache" / "uni-agent" / "llama.cpp")


def make_build_root(root: Path) -> None:
    """`root` (a build's dir under cache_root()), made. Under the default cache, ~/.cache/uni-agent is made 0700 first,
    as a run makes it (uni_agent.sandbox.private_dir): made here with the umask's 0755, every user of the node could
    list it and the build for as long as the first build took, until the first run narrowed it."""
    if not os.environ.get("UNI_AGENT_LLAMA_DIR"):
        users_cache = cache_root().parent
        users_cache.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(users_cache, 0o700)  # the umask may narrow it further, never widen it
    root.mkdir(parents=True, exist_ok=True)


def recipe_key(variant: str, recipe: str = DEFAULT_RECIPE) -> str:
    """`<version>-<variant>-<recipe>-<hash>`: the hash covers every flag and the QUICK_CMAKE text (not the GPUs'
    architectures, which only the building machine knows), so changing them gives a new cache directory."""
    flags = configure_flags(variant, "ARCHS" if variant == "cuda" else "", recipe)
    text = "\n".join(flags) + (QUICK_CMAKE if recipe == "quick" else "")
    return f"{SOURCE_VERSION}-{variant}-{recipe}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def binary_path(variant: str, recipe: str = DEFAULT_RECIPE) -> Path:
    return cache_root() / recipe_key(variant, recipe) / "bin" / "llama-server"


def find_binary(variant: str, recipe: str = DEFAULT_RECIPE) -> Path | None:
    path = binary_path(variant, recipe)
    return path if path.is_file() and os.access(path, os.X_OK) else None


def has_nvidia_gpu() -> bool:
    return bool(cuda_architectures())


def cuda_architectures() -> str:
    """The GPUs' compute capabilities as CMake wants them ("90", "80;90"), "" when nvidia-smi finds none."""
    if shutil.which("nvidia-smi") is None:
        return ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    caps = sorted({line.strip().replace(".", "") for line in out.splitlines() if line.strip()})
    return ";".join(c for c in caps if c.isdigit())


def configure_flags(variant: str, cuda_archs: str = "", recipe: str = DEFAULT_RECIPE) -> list[str]:
    """CMake's -D flags for a variant and recipe (the quick recipe's QUICK_CMAKE file is added by the build)."""
    if recipe not in RECIPES:
        raise LlamaBuildError(f"unknown llama-server build recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    extra = QUICK_FLAGS if recipe == "quick" else []
    if variant == "cpu":
        return COMMON_FLAGS + CPU_FLAGS + extra
    if variant == "cuda":
        if not cuda_archs:
            raise LlamaBuildError("the cuda variant needs the GPUs' compute capabilities: nvidia-smi found no GPU "
                                  "(build it on a GPU node)")
        return COMMON_FLAGS + ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_archs}", "-DGGML_NATIVE=OFF"] + extra
    raise LlamaBuildError(f"unknown llama-server variant {variant!r}; choose one of {', '.join(VARIANTS)}")


def _run_step(step: str, command: list[str], log_dir: Path, *, cwd: Path | None = None,
              env: dict[str, str] | None = None) -> None:
    log_path = log_dir / f"{step}.log"
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(command) + "\n").encode())
        log.flush()
        try:
            code = subprocess.run(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env={**os.environ, **(env or {})}).returncode
        except OSError as exc:
            raise LlamaBuildError(f"llama-server build failed at step '{step}': {exc}; see {log_path}") from None
    if code != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise LlamaBuildError(f"llama-server build failed at step '{step}' (exit {code}); see {log_path}:\n{tail}")


def _unpack(sdist: Path, dest: Path) -> Path:
    """The vendored llama.cpp tree only, without its docs, models and web-UI sources (half the archive)."""
    prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
    skip = tuple(prefix + d for d in ("docs/", "models/", "tools/ui/node_modules/", "media/", ".git/"))
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and not m.name.startswith(skip)]
        if not members:
            raise LlamaBuildError(f"{sdist} holds no {prefix}: not the llama-cpp-python sdist this build expects")
        # filter= exists from Python 3.11.4 (Debian 12 ships 3.11.2); the members are plain files of one prefix anyway
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **extra)
    return dest / prefix


def configure(source: Path, build_dir: Path, flags: list[str], recipe: str, log_dir: Path) -> None:
    """CMake's configure step (Ninja where it is installed), with the quick recipe's QUICK_CMAKE included."""
    build_dir.mkdir(parents=True, exist_ok=True)
    if recipe == "quick":
        (build_dir / "quick.cmake").write_text(QUICK_CMAKE)
        flags = [*flags, f"-DCMAKE_PROJECT_INCLUDE={build_dir / 'quick.cmake'}"]
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run_step("configure", ["cmake", "-S", str(source), "-B", str(build_dir), *generator, *flags,
                            "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"], log_dir)  # each file's flags, to check or time


def build(variant: str = "cpu", *, recipe: str = DEFAULT_RECIPE, jobs: int | None = None, sdist: Path | None = None,
          quiet: bool = False) -> Path:
    """Build (or find) the llama-server of `variant`; returns its path. Safe to run twice at once (a file lock)."""
    if variant == "auto":
        variant = "cuda" if has_nvidia_gpu() else "cpu"
    target = binary_path(variant, recipe)
    root = target.parent.parent
    make_build_root(root)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second setup on the same home waits for the first, then finds it
        if find_binary(variant, recipe):
            return target
        flags = configure_flags(variant, cuda_architectures() if variant == "cuda" else "", recipe)
        log_dir = root / "logs"
        log_dir.mkdir(exist_ok=True)
        jobs = jobs or len(os.sched_getaffinity(0)) or 2  # the cores this process may use (taskset, containers)
        say = (lambda msg: None) if quiet else (lambda msg: print(f"llama-server: {msg}", file=sys.stderr, flush=True))
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="llama-build-", dir=root) as tmp:
            work = Path(tmp)
            if sdist is None:
                say(f"downloading the {SOURCE_PACKAGE}=={SOURCE_VERSION} sdist (its vendored llama.cpp source)")
                _run_step("download", [sys.executable, "-m", "pip", "download", "--no-deps",
                                       # the sdist of this one package; ":all:" would also build its build
                                       # dependencies from source to read its metadata (minutes instead of seconds)
                                       "--no-binary", SOURCE_PACKAGE,
                                       "-d", str(work), f"{SOURCE_PACKAGE}=={SOURCE_VERSION}"],
                          log_dir)
                found = sorted(work.glob("*.tar.gz"))
                if not found:
                    raise LlamaBuildError(f"llama-server build failed at step 'download': no sdist in {work}; see "
                                          f"{log_dir / 'download.log'}")
                sdist = found[0]
            say("unpacking")
            try:
                source = _unpack(sdist, work / "src")
            except (tarfile.TarError, OSError) as exc:
                raise LlamaBuildError(f"llama-server build failed at step 'unpack': {sdist}: {exc}") from None
            build_dir = work / "build"
            say(f"configuring the {variant} build ({recipe} recipe)")
            configure(source, build_dir, flags, recipe, log_dir)
            say(f"compiling with {jobs} jobs (CPU: 3-5 minutes on 2 cores; CUDA: about 4 minutes on 12-16)")
            _run_step("build", ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)],
                      log_dir)
            for kept, name in ((".ninja_log", "ninja_log.txt"), ("compile_commands.json", "compile_commands.json")):
                if (build_dir / kept).exists():  # per-file compile times and flags, to make the build faster
                    shutil.copy2(build_dir / kept, log_dir / name)
            built = build_dir / "bin" / "llama-server"
            _run_step("check", [str(built), "--version"], log_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            staged = target.with_suffix(".new")
            shutil.copy2(built, staged)
            staged.replace(target)  # atomic: a reader sees the old state or the whole binary
        say(f"built {target} in {time.monotonic() - started:.0f} s")
        return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.engines.llama_build", description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="cpu", choices=[*VARIANTS, "auto"],
                        help="cpu (portable AVX2), cuda (this machine's GPUs), auto (cuda when nvidia-smi sees a GPU)")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, choices=RECIPES,
                        help="quick (hot code -O3, the rest -O1 in unity builds; the default) or plain (all -O3)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: the usable cores)")
    parser.add_argument("--sdist", type=Path, default=None, help="a llama-cpp-python sdist already downloaded")
    args = parser.parse_args(argv)
    try:
        print(build(args.variant, recipe=args.recipe, jobs=args.jobs, sdist=args.sdist))
    except LlamaBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
