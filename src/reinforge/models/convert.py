"""A GGUF file -> a normal Hugging Face folder (fp32 safetensors, config, tokenizer, chat template).

Why not `save_pretrained` on the model transformers loads with `gguf_file=`: that model carries a
`GgufHfQuantizer` (and `quantization_config` in its config) although its weights are already plain
fp32 tensors, and the quantizer says it is not serializable, so `save_pretrained` refuses. The
weights are copied into a fresh model built from the same config without `quantization_config`,
which saves normally; the saved folder is reloaded and must give the same logits before it counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from reinforge.models.errors import ModelSourceError

_CHECK_PROMPT = "The capital of France is"


def gguf_architecture(path: Path) -> str:
    """The file's `general.architecture`, read from its header (fast: the tensors are not read)."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise ModelSourceError(
            f"reading {path} needs the 'gguf' package: pip install 'reinforge[models]'"
        ) from exc
    try:
        field = GGUFReader(path).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except KeyError as exc:
        raise ModelSourceError(f"{path} is not a model GGUF: it has no general.architecture") from exc
    except Exception as exc:  # the reader fails with ValueError, struct errors, IndexError...
        raise ModelSourceError(f"cannot read the GGUF file {path}: {type(exc).__name__}: {exc}") from exc


def check_servable(path: Path, architecture: str) -> None:
    """Refuse, before the slow load, what transformers can't load as a causal LM."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelSourceError(
            f"{path}: transformers cannot load GGUF architecture {architecture!r} "
            f"(it loads {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:
        raise ModelSourceError(f"{path}: cannot read the model config: {exc}") from exc
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelSourceError(
            f"{path}: architecture {architecture!r} ({type(config).__name__}) is not a causal LM, "
            "which is what the engine serves"
        )


def convert_gguf(path: Path, out_dir: Path) -> None:
    """Write `path` as a Hugging Face folder into `out_dir` (which must not exist yet), verified."""
    check_servable(path, gguf_architecture(path))
    try:
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:
        raise ModelSourceError(f"transformers cannot load {path}: {type(exc).__name__}: {exc}") from exc
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
