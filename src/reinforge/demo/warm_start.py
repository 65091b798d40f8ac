"""Build, save and load the calc demo's warm-started policy (tokenizer + 1.1M-parameter Llama).

`build_warm_start` is the whole recipe: tokenizer trained on the task's text, a fresh tiny Llama, and
a short supervised run on the synthetic trace mix (see `reinforge.demo.traces`). The package ships the
result (`SHIPPED_WARM_START`, about 4.3 MB) so the demo starts in seconds; `reinforge demo
--rebuild-warm-start` runs the recipe again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from reinforge.demo.calculator import CALCULATOR_TOOL
from reinforge.demo.tasks import generate_tasks
from reinforge.demo.traces import TraceMix, corpus_text, synthetic_traces
from reinforge.errors import InvalidRequestError
from reinforge.models import CHAT_TEMPLATE, build_tokenizer, tiny_llama
from reinforge.training.sft import SftConfig, SftReport, render_conversation, supervised_finetune

SHIPPED_WARM_START = Path(__file__).parent / "assets" / "calc-warm-start"
TOOL_CALL_PREFIX = '{"name":"calculator","arguments":{"expression":"'
"""The fixed text before every calculator expression, as the chat template writes it."""


class SftPhase(BaseModel):
    """One supervised phase: its optimiser settings and, optionally, its own trace mix."""

    model_config = ConfigDict(extra="forbid")

    sft: SftConfig
    mix: TraceMix | None = None
    """None: the recipe's mix. A phase with its own mix trains on traces drawn with it (same tasks)."""


class WarmStartConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_traces: int = Field(default=20000, ge=1)
    """Distinct training questions: too few left the second calculator call inexact on precedence
    conflicts (docs/training.md, "The warm start", has the comparison)."""
    vocab_size: int = Field(default=320, ge=270)
    special_tokens: list[str] = Field(default_factory=lambda: [TOOL_CALL_PREFIX, "ANSWER: "])
    """Fixed strings made single tokens. Byte-level BPE cannot merge across punctuation, so the
    tool-call JSON was 13 tokens between `<tool_call>` and the expression; as one token the model
    copies operands over a much shorter distance (the second call's was the warm start's weak spot)."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    seed: int = 0
    mix: TraceMix = Field(default_factory=TraceMix)
    sft_phases: list[SftPhase] = Field(
        default_factory=lambda: [
            # Copying first: every trace makes both calculator calls, so every example teaches the
            # operand copying (the skill that takes the steps) and none teaches guessing yet.
            SftPhase(
                sft=SftConfig(steps=2000, batch_size=64, learning_rate=3e-3, warmup_steps=30, seed=0),
                mix=TraceMix(guess=0.0, whole_expression=0.0, answer_early=0.0),
            ),
            # Then the designed decision biases (guessing, answering early), without left-to-right
            # traces: they teach "result op c" as the second call on precedence conflicts, which
            # drowned the right "a op result" there.
            SftPhase(
                sft=SftConfig(steps=400, batch_size=32, learning_rate=1e-3, warmup_steps=10, seed=2),
                mix=TraceMix(left_to_right=0.0, answer_early=0.7),
            ),
        ],
        min_length=1,
    )
    """Supervised phases run in order, each with a fresh optimiser and schedule. Copying the right
    operands into the calculator calls is what takes the steps."""


def build_warm_start(
    out_dir: Path,
    config: WarmStartConfig | None = None,
    *,
    on_step: Callable[[int, float], None] | None = None,
) -> SftReport:
    """Train the tokenizer and the warm-started model from scratch and save both to `out_dir`."""
    config = config or WarmStartConfig()
    torch.manual_seed(config.seed)
    tasks = generate_tasks("train", config.num_traces, seed=config.seed)
    traces = synthetic_traces(tasks, seed=config.seed, mix=config.mix)
    tools = [CALCULATOR_TOOL]
    tokenizer = build_tokenizer(
        corpus_text(traces, tools), vocab_size=config.vocab_size, special_tokens=config.special_tokens
    )
    model = tiny_llama(
        tokenizer,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        seed=config.seed,
    )
    examples = [render_conversation(tokenizer, trace, tools) for trace in traces]
    pad_id = tokenizer.pad_token_id
    assert pad_id is not None
    reports = []
    for i, phase in enumerate(config.sft_phases):
        data = examples
        if phase.mix is not None:
            phase_traces = synthetic_traces(tasks, seed=config.seed + i, mix=phase.mix)
            data = [render_conversation(tokenizer, trace, tools) for trace in phase_traces]
        reports.append(supervised_finetune(model, data, phase.sft, pad_id=pad_id, on_step=on_step))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "warm_start.json").write_text(config.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return SftReport(
        steps=sum(r.steps for r in reports),
        seconds=sum(r.seconds for r in reports),
        first_loss=reports[0].first_loss,
        last_loss=reports[-1].last_loss,
    )


def load_warm_start(path: Path | None = None) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Load a saved warm start (the shipped one by default) in float32, ready to train."""
    path = path or SHIPPED_WARM_START
    if not (path / "config.json").is_file():
        raise InvalidRequestError(
            f"no warm-start checkpoint at {path}; build one with `reinforge demo --rebuild-warm-start`"
        )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    # Set from code, not the saved file: the template is part of reinforge, not of a checkpoint.
    tokenizer.chat_template = CHAT_TEMPLATE
    model = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    return model, tokenizer
