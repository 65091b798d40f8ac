"""A GGUF file -> a normal Hugging Face folder (fp32 safetensors, config, tokenizer, chat template).

Why not `save_pretrained` on the model transformers loads with `gguf_file=`: that model carries a
`GgufHfQuantizer` (and `quantization_config` in its config) although its weights are already plain
fp32 tensors, and the quantizer says it is not serializable, so `save_pretrained` refuses. The
weights are copied into a fresh model built from the same config without `quantization_config`,
which saves normally; the saved folder is reloaded and must give the same logits before it counts.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from reinforge.models.errors import ModelSourceError

_CHECK_PROMPT = "The capital of France is"


def gguf_architecture(path: Path) -> str:
    """The file's `general.architecture`, read from its header. Read directly, not with `gguf`'s
    `GGUFReader`: the reader parses every metadata field first, and a large vocabulary's token list
    (Gemma 3: 262,144 strings) takes it tens of seconds; the architecture is the header's first
    field, so this stops there (docs/models.md, "Converting a GGUF")."""
    try:
        with path.open("rb") as f:
            value = _header_string(f, "general.architecture")
    except ImportError as exc:
        raise ModelSourceError(
            f"reading {path} needs the 'gguf' package: pip install 'reinforge[models]'"
        ) from exc
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ModelSourceError(f"cannot read the GGUF file {path}: {type(exc).__name__}: {exc}") from exc
    if value is None:
        raise ModelSourceError(f"{path} is not a model GGUF: it has no general.architecture")
    return value


def _header_string(f: BinaryIO, wanted: str) -> str | None:
    """The string value of metadata key `wanted` in the GGUF file `f`, or None when the header has no
    such key (value types and their sizes as the `gguf` package defines them). Raises ValueError for
    what is not a GGUF header."""
    from gguf import GGUFReader, GGUFValueType

    scalar_sizes = {int(k): np.dtype(t).itemsize for k, t in GGUFReader.gguf_scalar_to_np.items()}
    if f.read(4) != b"GGUF":
        raise ValueError("no GGUF magic number")
    (version,) = struct.unpack("<I", f.read(4))
    order = "<" if version < 0x10000 else ">"  # a big-endian file's version reads byte-swapped
    if order == ">":
        (version,) = struct.unpack(">I", struct.pack("<I", version))
    if version not in (1, 2, 3):
        raise ValueError(f"unknown GGUF version {version}")
    count = f"{order}{'I' if version == 1 else 'Q'}"  # version 1 counted in 32 bits
    size = struct.calcsize(count)

    def number(fmt: str, n: int) -> int:
        return int(struct.unpack(fmt, f.read(n))[0])

    def string() -> bytes:  # a key or the value looked for: short (the format caps keys at 65,535 bytes)
        n = number(count, size)
        if n > 65535:
            raise ValueError(f"a metadata string of {n} bytes where a key or a name belongs")
        return f.read(n)

    def skip(kind: int) -> None:
        if kind in scalar_sizes:
            f.seek(scalar_sizes[kind], 1)
        elif kind == GGUFValueType.STRING:
            f.seek(number(count, size), 1)
        elif kind == GGUFValueType.ARRAY:
            item, n = number(f"{order}I", 4), number(count, size)
            if item in scalar_sizes:
                f.seek(scalar_sizes[item] * n, 1)
            else:
                for _ in range(n):
                    skip(item)
        else:
            raise ValueError(f"unknown GGUF value type {kind}")

    number(count, size)  # tensors
    for _ in range(number(count, size)):  # metadata fields
        key = string().decode()
        kind = number(f"{order}I", 4)
        if key == wanted and kind == GGUFValueType.STRING:
            return string().decode()
        skip(kind)
    return None


def check_servable(path: Path, architecture: str) -> None:
    """Refuse, before the slow load, a GGUF architecture transformers can't load."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelSourceError(
            f"{path}: transformers cannot load GGUF architecture {architecture!r} "
            f"(it loads {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )


def convert_gguf(path: Path, out_dir: Path) -> None:
    """Write `path` as a Hugging Face folder into `out_dir` (which must not exist yet), verified."""
    architecture = gguf_architecture(path)
    check_servable(path, architecture)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:
        raise ModelSourceError(_load_failure(path, architecture, exc)) from exc
    plain = _without_quantizer(loaded)
    # The GGUF tokenizer knows no length limit; the model's position limit is the real one.
    tokenizer.model_max_length = int(getattr(plain.config, "max_position_embeddings", 0) or 0) or None
    out_dir.mkdir(parents=True)
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    del plain  # a third fp32 copy (the reload below) would be one too many for the bigger models
    ids = tokenizer(_CHECK_PROMPT, return_tensors="pt").input_ids
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    diff = (_logits(reloaded, ids) - _logits(loaded, ids)).abs().max().item()
    if diff != 0.0:
        raise ModelSourceError(f"{path}: the converted weights give other logits (max abs diff {diff})")


def _load_failure(path: Path, architecture: str, exc: Exception) -> str:
    """Why transformers could not load the file as a causal LM, in words: its config is read again only
    here, on the way out (every read of a GGUF parses its whole metadata, slow for a large vocabulary)."""
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as config_exc:
        return f"{path}: cannot read the model config: {config_exc}"
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        return (
            f"{path}: architecture {architecture!r} ({type(config).__name__}) is not a causal LM, "
            "which is what the engine serves"
        )
    return f"transformers cannot load {path}: {type(exc).__name__}: {exc}"


def _without_quantizer(loaded: PreTrainedModel) -> PreTrainedModel:
    """The same weights in a model whose config has no `quantization_config` (so it can be saved)."""
    values: dict[str, Any] = loaded.config.to_dict()
    values.pop("quantization_config", None)
    values.pop("_name_or_path", None)
    values["dtype"] = "float32"
    config = type(loaded.config).from_dict(values)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise ModelSourceError(f"weights do not fit the config: missing {missing}, unexpected {unexpected}")
    plain.generation_config = loaded.generation_config
    return plain.eval()


@torch.no_grad()
def _logits(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    return model.eval()(input_ids=ids).logits
