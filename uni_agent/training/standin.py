"""A STAND-IN for a trainer's weight update, for examples and tests on the CPU: it does not learn anything.

`perturb_gguf` writes a copy of a GGUF model whose F32 tensors (in SmolLM2's Q4_1 file: the 61 RMSNorm weight
vectors) are multiplied by (1 + scale * noise), noise drawn from a seeded normal: a new policy whose next-token
distribution differs measurably from the old one (the tests re-score tokens on the server to tell them apart),
in the format llama-server loads. A real trainer writes its checkpoint instead (see docs/online.md).
Needs the `gguf` package (`pip install 'uni-agent[rl]'`)."""

from __future__ import annotations

import shutil
from pathlib import Path


def perturb_gguf(source: str | Path, target: str | Path, *, scale: float = 0.05, seed: int = 0) -> dict[str, int]:
    """Copy `source` to `target` with its F32 tensors perturbed; returns {"tensors": n, "values": m} changed."""
    try:
        import numpy as np
        from gguf import GGUFReader, GGMLQuantizationType
    except ImportError as exc:
        raise RuntimeError("the stand-in trainer needs the gguf package: pip install 'uni-agent[rl]'") from exc
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")  # a reader never sees a half-written model
    shutil.copyfile(source, partial)
    rng = np.random.default_rng(seed)
    reader = GGUFReader(partial, "r+")  # a writable memory map of the copy: tensors change in place
    tensors = values = 0
    for tensor in reader.tensors:
        if tensor.tensor_type != GGMLQuantizationType.F32:
            continue
        data = tensor.data
        data[...] = data * (1.0 + scale * rng.standard_normal(data.shape)).astype(np.float32)
        tensors, values = tensors + 1, values + data.size
    reader.data.flush()
    del reader
    partial.replace(target)
    return {"tensors": tensors, "values": values}
