"""A trainer's weights as a GGUF file llama-server loads: llama.cpp's own converter, from the pinned source.

    seconds = export_gguf(model, tokenizer, "ckpt/v3.gguf", work_dir="ckpt/hf")   # then service.update_weights(3, ...)

The converter is `convert_hf_to_gguf.py` with its `conversion/` package and `gguf-py/`, from the llama.cpp tree
vendored in the same llama-cpp-python sdist the engine is built from (uni_agent.engines.llama_build): the writer of
the file and the reader in llama-server are one version. Only those three entries are unpacked, once, into
`<llama.cpp cache>/convert-<version>/` (from an sdist given, else `pip download` as the build does).

The checkpoint is written as a Hugging Face folder (safetensors, F16 when the GGUF is F16: half the bytes to write
and read) and converted in a child process: the converter imports torch and transformers itself, and its module
state (a registry of model classes) stays out of the trainer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines.llama_build import SOURCE_PACKAGE, SOURCE_VERSION, cache_root
from .policy import save_policy

CONVERTER_ENTRIES = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


class ExportError(RuntimeError):
    """The converter failed; the message has the end of its output."""


@dataclass
class ExportTimes:
    save_s: float  # the Hugging Face checkpoint written
    convert_s: float  # llama.cpp's converter, from its start to the GGUF in place

    @property
    def seconds(self) -> float:
        return round(self.save_s + self.convert_s, 3)


def converter_dir(sdist: str | Path | None = None) -> Path:
    """The folder holding llama.cpp's convert_hf_to_gguf.py (unpacked on first use)."""
    target = cache_root() / f"convert-{SOURCE_VERSION}"
    if (target / "convert_hf_to_gguf.py").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="convert-", dir=target.parent) as tmp:
        if sdist is None:
            sdist = _download_sdist(Path(tmp))
        prefix = f"{Path(sdist).name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        staged = Path(tmp) / "staged"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                       and m.name[len(prefix):].startswith(CONVERTER_ENTRIES)]
            if not any(m.name.endswith("convert_hf_to_gguf.py") for m in members):
                raise ExportError(f"{sdist} holds no {prefix}convert_hf_to_gguf.py")
            extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(staged, members=members, **extra)
        try:
            (staged / prefix).rename(target)  # whole or not at all: a second process may have won the race
        except OSError:
            if not (target / "convert_hf_to_gguf.py").is_file():
                raise
    return target


def _download_sdist(into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SOURCE_PACKAGE, "-d",
                    str(into), f"{SOURCE_PACKAGE}=={SOURCE_VERSION}"], check=True, capture_output=True)
    found = sorted(into.glob("*.tar.gz"))
    if not found:
        raise ExportError(f"pip download of {SOURCE_PACKAGE}=={SOURCE_VERSION} gave no sdist")
    return found[0]


def export_gguf(model: Any, tokenizer: Any, out_path: str | Path, *, work_dir: str | Path, outtype: str = "f16",
                sdist: str | Path | None = None, timeout: float = 600) -> ExportTimes:
    """Write `model` to `out_path` as a GGUF of `outtype` (f16, bf16, f32, q8_0); `work_dir` holds the Hugging Face
    checkpoint in between (replaced each time). A reader never sees a half-written file."""
    import torch

    converter = converter_dir(sdist) / "convert_hf_to_gguf.py"
    out_path, work_dir = Path(out_path), Path(work_dir)
    started = time.monotonic()
    if work_dir.exists():
        shutil.rmtree(work_dir)
    half = outtype == "f16"  # the converter rounds to F16 anyway: write half the bytes
    state = {k: v.detach().to(torch.float16) for k, v in model.state_dict().items()} if half else None
    _save(model, tokenizer, work_dir, state)
    saved = time.monotonic()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(f".{out_path.name}.partial")
    run = subprocess.run([sys.executable, str(converter), str(work_dir), "--outtype", outtype, "--outfile",
                          str(partial)], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if run.returncode != 0 or not partial.is_file():
        raise ExportError(f"convert_hf_to_gguf.py exited {run.returncode}:\n{(run.stdout + run.stderr)[-3000:]}")
    partial.replace(out_path)
    return ExportTimes(round(saved - started, 3), round(time.monotonic() - saved, 3))


def _save(model: Any, tokenizer: Any, folder: Path, state: dict[str, Any] | None) -> None:
    if state is None:
        save_policy(model, tokenizer, folder)
        return
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, state_dict=state)
    tokenizer.save_pretrained(folder)
