"""The supervised warm start: which tokens carry loss, and that training lowers it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from reinforge.demo.calculator import CALCULATOR_TOOL
from reinforge.demo.tasks import generate_tasks, make_task
from reinforge.demo.traces import TraceMix, synthetic_trace, synthetic_traces
from reinforge.errors import InvalidRequestError
from reinforge.training.device import native_bfloat16
from reinforge.training.sft import (
    SftConfig,
    SftExample,
    _collate,
    length_grouped_batches,
    masked_lm_loss,
    render_conversation,
    shared_prefix_length,
    shared_prefix_loss,
    supervised_finetune,
)
from reinforge.training.sft_rewrite import RewritingExamples, mask_segments

from .conftest import small_model

RIGHT = TraceMix(guess=0, whole_expression=0, left_to_right=0, answer_early=0)


def test_only_assistant_tokens_carry_loss(tokenizer: Any) -> None:
    trace = synthetic_trace(make_task(7, "+", 18, "*", 2), random.Random(0), RIGHT)
    example = render_conversation(tokenizer, trace, [CALCULATOR_TOOL])
    trained = [t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m]
    text = tokenizer.decode(trained)
    assert text == (
        '<tool_call>{"name":"calculator","arguments":{"expression":"18*2"}}</tool_call></s>'
        '<tool_call>{"name":"calculator","arguments":{"expression":"7+36"}}</tool_call></s>'
        "ANSWER: 43</s>"
    )
    context = tokenizer.decode(
        [t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if not m]
    )
    assert "7+18*2" in context and "<|tool|>36</s>" in context and "calculator(expression)" in context


def test_conversations_without_assistant_turns_are_rejected(tokenizer: Any) -> None:
    with pytest.raises(InvalidRequestError, match="assistant"):
        render_conversation(tokenizer, [{"role": "user", "content": "1+2"}])


def test_supervised_finetune_lowers_the_loss(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    traces = synthetic_traces(generate_tasks("train", 64, seed=1), seed=1)
    examples = [render_conversation(tokenizer, t, [CALCULATOR_TOOL]) for t in traces]
    seen: list[float] = []
    report = supervised_finetune(
        model,
        examples,
        SftConfig(steps=25, batch_size=16, learning_rate=3e-3, warmup_steps=2),
        pad_id=tokenizer.pad_token_id,
        on_step=lambda step, loss: seen.append(loss),
    )
    assert report.steps == 25 and len(seen) == 25
    assert report.last_loss < 0.6 * report.first_loss
    assert not model.training  # left in eval mode for generation
    with pytest.raises(InvalidRequestError):
        supervised_finetune(model, [])


def test_bfloat16_autocast_trains_float32_weights_on_bfloat16_activations(tokenizer: Any) -> None:
    traces = synthetic_traces(generate_tasks("train", 64, seed=1), seed=1)
    examples = [render_conversation(tokenizer, t, [CALCULATOR_TOOL]) for t in traces]
    reports = {}
    for dtype in ("float32", "bfloat16"):
        model = small_model(tokenizer)  # the same seeded weights each time
        config = SftConfig(steps=25, batch_size=16, warmup_steps=2, dtype=dtype)
        reports[dtype] = supervised_finetune(model, examples, config, pad_id=tokenizer.pad_token_id)
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert reports[dtype].precision == dtype
    fp32, mixed = reports["float32"], reports["bfloat16"]
    # The same first batch on the same weights: only bfloat16's rounding tells the losses apart.
    assert mixed.first_loss == pytest.approx(fp32.first_loss, rel=0.02)
    assert mixed.first_loss != fp32.first_loss
    assert mixed.last_loss < 0.6 * mixed.first_loss
    with pytest.raises(ValueError, match="dtype"):
        SftConfig(dtype="float16")  # type: ignore[arg-type]


def test_auto_precision_follows_what_the_cpu_runs_natively(tokenizer: Any) -> None:
    traces = synthetic_traces(generate_tasks("train", 16, seed=1), seed=1)
    examples = [render_conversation(tokenizer, t, [CALCULATOR_TOOL]) for t in traces]
    config = SftConfig(steps=2, batch_size=8, warmup_steps=0, dtype="auto")
    report = supervised_finetune(small_model(tokenizer), examples, config, pad_id=tokenizer.pad_token_id)
    expected = "bfloat16" if native_bfloat16(torch.device("cpu")) else "float32"
    assert report.precision == expected


def test_prompt_loss_weight_weighs_context_tokens_and_zero_leaves_them_out(tokenizer: Any) -> None:
    short = SftExample(input_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1])
    long = SftExample(input_ids=[5, 6, 7, 8, 9, 10], loss_mask=[0, 0, 0, 1, 1, 0])
    _, _, mask = _collate([short, long], 0, torch.device("cpu"))
    assert mask.tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0]]
    _, _, weighted = _collate([short, long], 0, torch.device("cpu"), 0.25)
    assert weighted.tolist() == [[0.25, 0.25, 1, 1, 0, 0], [0.25, 0.25, 0.25, 1, 1, 0.25]]  # padding stays 0
    traces = synthetic_traces(generate_tasks("train", 32, seed=1), seed=1)
    examples = [render_conversation(tokenizer, t, [CALCULATOR_TOOL]) for t in traces]
    losses = {}
    for weight in (0.0, 0.5):
        config = SftConfig(steps=1, batch_size=8, warmup_steps=0, prompt_loss_weight=weight)
        report = supervised_finetune(small_model(tokenizer), examples, config, pad_id=tokenizer.pad_token_id)
        losses[weight] = report.first_loss
    assert losses[0.0] != losses[0.5]  # the same first batch and weights: only the prompt's share differs
    with pytest.raises(ValueError, match="prompt_loss_weight"):
        SftConfig(prompt_loss_weight=1.5)


def test_native_bfloat16_reads_the_cpu_flags(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n")
    assert native_bfloat16(cpu, info) is False  # AVX2 only: autocast would emulate bfloat16
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n")
    assert native_bfloat16(cpu, info) is True
    info.write_text("flags\t\t: fpu avx512f amx_bf16\n")
    assert native_bfloat16(cpu, info) is True
    assert native_bfloat16(cpu, tmp_path / "missing") is False  # not Linux: float32, the safe choice
    assert native_bfloat16(torch.device("meta"), info) is False


def test_length_grouped_batches_cover_every_example_once_per_epoch_with_little_padding() -> None:
    rng = random.Random(3)
    lengths = [rng.randrange(10, 400) for _ in range(1000)]
    batches = length_grouped_batches(lengths, 16, random.Random(0))
    epoch = [next(batches) for _ in range(63)]  # 1000 / 16 -> 62 full batches and one of 8
    seen = [i for batch in epoch for i in batch]
    assert sorted(seen) == list(range(1000))
    padded = sum(len(b) * max(lengths[i] for i in b) for b in epoch)
    random_padded = sum(16 * max(rng.sample(lengths, 16)) for _ in range(63))
    assert padded < 0.6 * random_padded  # most of a random batch is padding; a grouped one is not
    assert sorted(i for _ in range(63) for i in next(batches)) == list(range(1000))  # the next epoch too


def test_length_grouped_finetune_lowers_the_loss(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    traces = synthetic_traces(generate_tasks("train", 64, seed=2), seed=2)
    examples = [render_conversation(tokenizer, t, [CALCULATOR_TOOL]) for t in traces]
    report = supervised_finetune(
        model,
        examples,
        SftConfig(steps=25, batch_size=16, warmup_steps=2, batching="length_grouped"),
        pad_id=tokenizer.pad_token_id,
    )
    assert report.steps == 25 and report.last_loss < 0.6 * report.first_loss


def _named_example(tokenizer: Any, name: str) -> SftExample:
    messages = [
        {"role": "user", "content": f"Who founded {name} Labs?"},
        {"role": "assistant", "content": f"ANSWER: {name}"},
        {"role": "user", "content": f"And {name} again?"},
        {"role": "assistant", "content": f"ANSWER: {name} {name}"},
    ]
    return render_conversation(tokenizer, messages)


def test_a_rewrite_renames_each_segment_and_keeps_what_is_trained(tokenizer: Any) -> None:
    example = _named_example(tokenizer, "Bora")
    seen: list[list[str]] = []

    def rename(segments: list[str], rng: random.Random) -> list[str]:
        seen.append(segments)
        return [s.replace("Bora", "Kelvintor") for s in segments]

    rewritten = RewritingExamples(tokenizer, rename)(example, random.Random(0))
    assert rewritten == _named_example(tokenizer, "Kelvintor")  # as if recorded with the new name
    assert [flag for flag, _ in mask_segments(example)] == [0, 1, 0, 1]
    assert "".join(seen[0]) == tokenizer.decode(example.input_ids)
    unchanged = RewritingExamples(tokenizer, lambda segments, rng: segments)(example, random.Random(0))
    assert unchanged == example


def test_a_rewrite_must_return_every_segment(tokenizer: Any) -> None:
    example = _named_example(tokenizer, "Bora")
    with pytest.raises(ValueError, match="returned 1 segments for 4"):
        RewritingExamples(tokenizer, lambda segments, rng: segments[:1])(example, random.Random(0))


def test_an_example_that_does_not_decode_losslessly_is_used_as_recorded(tokenizer: Any) -> None:
    example = _named_example(tokenizer, "Bora")
    # two pieces where the tokenizer would write one: decoding and encoding again would merge them
    merged = tokenizer("ANSWER", add_special_tokens=False)["input_ids"]
    split = [t for ch in "ANSWER" for t in tokenizer(ch, add_special_tokens=False)["input_ids"]]
    assert merged != split
    odd = SftExample(
        input_ids=[*example.input_ids, *split], loss_mask=[*example.loss_mask, *[1] * len(split)]
    )
    rewrite = RewritingExamples(tokenizer, lambda segments, rng: [s.upper() for s in segments])
    assert rewrite(odd, random.Random(0)) == odd
    assert rewrite.kept_as_recorded == 1


def test_supervised_finetune_draws_each_batch_through_augment(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    examples = [_named_example(tokenizer, name) for name in ("Bora", "Lumo", "Tesk", "Vira")]
    drawn: list[int] = []

    def augment(example: SftExample, rng: random.Random) -> SftExample:
        drawn.append(len(example.input_ids))
        return example

    supervised_finetune(model, examples, SftConfig(steps=3, batch_size=2, threads=1), augment=augment)
    assert len(drawn) == 6


def test_shared_prefix_loss_equals_the_plain_loss_and_trains(tokenizer: Any) -> None:
    """The prefix run once gives the very loss and gradient of the full examples."""
    model = small_model(tokenizer).eval()
    system = {"role": "system", "content": "You compute. " * 20}  # the long context all examples share
    traces = synthetic_traces(generate_tasks("train", 6, seed=3), seed=3)
    examples = [render_conversation(tokenizer, [system, *t], [CALCULATOR_TOOL]) for t in traces]
    length = shared_prefix_length(examples)
    assert length > 40 and all(ex.input_ids[:length] == examples[0].input_ids[:length] for ex in examples)
    assert all(1 not in ex.loss_mask[: length + 1] for ex in examples)
    device = torch.device("cpu")
    plain = masked_lm_loss(model, *_collate(examples, 0, device))
    plain.backward()
    plain_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    shared = shared_prefix_loss(model, examples, 0, device)
    shared.backward()
    shared_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    assert float(shared.detach()) == pytest.approx(float(plain.detach()), rel=1e-4)
    assert len(shared_grads) == len(plain_grads)
    for a, b in zip(shared_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    # One example alone: its whole context up to the token before the first trained one.
    (alone,) = examples[:1]
    assert shared_prefix_length([alone]) == alone.loss_mask.index(1) - 1

    report = supervised_finetune(
        model,
        examples,
        SftConfig(steps=8, batch_size=6, learning_rate=3e-3, warmup_steps=0, shared_prefix=True),
    )
    with torch.no_grad():
        after = masked_lm_loss(model, *_collate(examples, 0, device))
    assert float(after) < float(plain.detach()) and report.steps == 8
    with pytest.raises(InvalidRequestError, match="prompt_loss_weight"):
        supervised_finetune(model, examples, SftConfig(steps=1, shared_prefix=True, prompt_loss_weight=0.5))
