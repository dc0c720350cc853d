"""Builds llama.cpp's own `llama-server` once per machine, from a pinned source a registry package ships.

The source is the llama.cpp tree vendored in the `llama-cpp-python` sdist on PyPI (pinned below): `pip download`
fetches it like any other dependency, so no step reaches anything but the package registry. The build is cached
under ~/.cache/uni-agent/llama.cpp/<version>-<variant>/ (UNI_AGENT_LLAMA_DIR moves it), one directory per variant:

* `cpu`: portable x86-64 with AVX2 (never -march=native: a native build crashed with a protection fault on a host
  whose CPU advertises AMX), so one cached binary runs on every AVX2 machine of a cluster with a shared home.
* `cuda`: `-DGGML_CUDA=ON` for the compute capabilities of the GPUs of the machine that builds it.

Each step (download, unpack, configure, build, check) writes its own log; a failed step is a LlamaBuildError naming
the step and its log. `python -m uni_agent.engines.llama_build [--variant cpu|cuda|auto]` builds and prints the path.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
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


class LlamaBuildError(RuntimeError):
    """A build step failed; the message names the step and its log."""


def cache_root() -> Path:
    return Path(os.environ.get("UNI_AGENT_LLAMA_DIR") or Path.home() / ".cache" / "uni-agent" / "llama.cpp")


def binary_path(variant: str) -> Path:
    return cache_root() / f"{SOURCE_VERSION}-{variant}" / "bin" / "llama-server"


def find_binary(variant: str) -> Path | None:
    path = binary_path(variant)
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


def configure_flags(variant: str, cuda_archs: str = "") -> list[str]:
    if variant == "cpu":
        return COMMON_FLAGS + CPU_FLAGS
    if variant == "cuda":
        if not cuda_archs:
            raise LlamaBuildError("the cuda variant needs the GPUs' compute capabilities: nvidia-smi found no GPU "
                                  "(build it on a GPU node)")
        return COMMON_FLAGS + ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_archs}", "-DGGML_NATIVE=OFF"]
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
        tar.extractall(dest, members=members, filter="data")
    return dest / prefix


def build(variant: str = "cpu", *, jobs: int | None = None, sdist: Path | None = None, quiet: bool = False) -> Path:
    """Build (or find) the llama-server of `variant`; returns its path. Safe to run twice at once (a file lock)."""
    if variant == "auto":
        variant = "cuda" if has_nvidia_gpu() else "cpu"
    target = binary_path(variant)
    root = target.parent.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second setup on the same home waits for the first, then finds it
        if find_binary(variant):
            return target
        flags = configure_flags(variant, cuda_architectures() if variant == "cuda" else "")
        log_dir = root / "logs"
        log_dir.mkdir(exist_ok=True)
        jobs = jobs or os.cpu_count() or 2
        say = (lambda msg: None) if quiet else (lambda msg: print(f"llama-server: {msg}", file=sys.stderr, flush=True))
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="llama-build-", dir=root) as tmp:
            work = Path(tmp)
            if sdist is None:
                say(f"downloading the {SOURCE_PACKAGE}=={SOURCE_VERSION} sdist (its vendored llama.cpp source)")
                _run_step("download", [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
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
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            say(f"configuring the {variant} build")
            _run_step("configure", ["cmake", "-S", str(source), "-B", str(build_dir), *generator, *flags], log_dir)
            say(f"compiling with {jobs} jobs (CPU: about 7 minutes on 2 cores; CUDA: about 4 minutes on 16)")
            _run_step("build", ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)],
                      log_dir)
            if (build_dir / ".ninja_log").exists():  # per-file compile times, for whoever wants the build faster
                shutil.copy2(build_dir / ".ninja_log", log_dir / "ninja_log.txt")
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
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    parser.add_argument("--sdist", type=Path, default=None, help="a llama-cpp-python sdist already downloaded")
    args = parser.parse_args(argv)
    try:
        print(build(args.variant, jobs=args.jobs, sdist=args.sdist))
    except LlamaBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
