"""The policy a trainer updates: a Hugging Face transformers causal LM, loaded from the GGUF the engines serve.

    model, tokenizer = load_policy(default_model_path(), device="cuda")   # SmolLM2-135M-Instruct, dequantized to F32
    model, tokenizer = tiny_policy(tokenizer, seed=0)                     # a random 2-layer model with the same vocab

transformers reads GGUF itself (through the `gguf` package) and dequantizes it; the model it returns is marked as
quantized and refuses `save_pretrained`, so the weights are moved into a plain model of the same config. The
tokenizer is rebuilt from the GGUF's own vocabulary, merges and chat template, so a checkpoint saved from here
converts back to a GGUF (uni_agent.training.gguf_export) with the same token ids the engines sampled.
Needs the `train` extra (torch, transformers, accelerate): imported lazily, so the package works without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TRAIN_EXTRA_HINT = "pip install 'uni-agent[train]' (torch, transformers, accelerate, sentencepiece)"


def require_train_extra() -> None:
    """A clear error when the training libraries are missing."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"the trainer needs torch and transformers: {TRAIN_EXTRA_HINT}") from exc


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a GGUF file, or of a folder of Hugging Face tokenizer files (one save_policy wrote)."""
    require_train_extra()
    from transformers import AutoTokenizer

    path = Path(path)
    if path.is_dir():
        return AutoTokenizer.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def load_policy(gguf_path: str | Path, device: str = "cpu") -> tuple[Any, Any]:
    """(model in F32 on `device`, tokenizer) from a GGUF file (any quantization transformers dequantizes)."""
    require_train_extra()
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(gguf_path)
    tokenizer = load_tokenizer(path)
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # dequantized already: a plain model saves and trains as any other
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    return model.to(device), tokenizer


def tiny_policy(tokenizer: Any, *, seed: int = 0, hidden: int = 64, layers: int = 2, device: str = "cpu") -> Any:
    """A randomly initialised Llama of a few hundred thousand parameters (plus the embedding) over `tokenizer`'s
    vocabulary: fast enough on a CPU to train, convert and serve in a test."""
    require_train_extra()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).to(device=device, dtype=torch.float32)


def save_policy(model: Any, tokenizer: Any, folder: str | Path) -> Path:
    """The model as a Hugging Face checkpoint (safetensors, config, tokenizer files): what llama.cpp's converter
    reads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
