"""`EngineProcess`: the real engine in a real child process, checked against the in-process engine."""

from __future__ import annotations

import asyncio
import copy
import glob
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import PreTrainedTokenizerFast

from reinforge.engine import Engine, EngineDelta, EngineError, EngineOutput, EngineProcess, EngineStoppedError
from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import SamplingParams

PROMPTS = ["What is 3 plus 4?", "What is 12 plus 1? It is", "What is 7 plus 20"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
LONG = SamplingParams(temperature=0.0, max_tokens=2000)
"""Seconds of decoding (this model's greedy text never ends early): still running when the test acts."""


def ids(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def shared_files() -> set[str]:
    return set(glob.glob("/dev/shm/reinforge-weights-*"))


@pytest.fixture(scope="module")
def child(llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> Iterator[EngineProcess]:
    """One child for the module (starting one imports torch: seconds); tests that change its weights
    put the originals back."""
    engine = EngineProcess(llama, tokenizer, max_batch_size=8, max_seq_len=128, seed=0).start()
    yield engine
    engine.stop()


async def test_outputs_match_the_in_process_engine(
    child: EngineProcess, llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast
) -> None:
    local = Engine(copy.deepcopy(llama), tokenizer, max_batch_size=8, max_seq_len=128, seed=0).start()
    try:
        prompts = [ids(tokenizer, p) for p in PROMPTS]
        theirs = await asyncio.gather(*(child.generate(p, GREEDY) for p in prompts))
        ours = await asyncio.gather(*(local.generate(p, GREEDY) for p in prompts))
    finally:
        local.stop()
    assert child.uses_fast_path
    for a, b in zip(theirs, ours, strict=True):
        assert isinstance(a, EngineOutput)
        assert a.token_ids == b.token_ids and len(a.token_ids) > 0
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert (a.text, a.finish_reason, a.policy_version) == (b.text, b.finish_reason, child.policy_version)


async def test_stream_yields_deltas_then_the_output(
    child: EngineProcess, tokenizer: PreTrainedTokenizerFast
) -> None:
    prompt = ids(tokenizer, PROMPTS[0])
    items = [item async for item in child.stream(prompt, GREEDY)]
    deltas, final = items[:-1], items[-1]
    assert isinstance(final, EngineOutput) and all(isinstance(d, EngineDelta) for d in deltas)
    assert "".join(d.text for d in deltas) == final.text
    assert [t for d in deltas for t in d.token_ids] == final.token_ids
    assert final.token_ids == (await child.generate(prompt, GREEDY)).token_ids


async def test_weights_swap_through_shared_memory(
    child: EngineProcess, llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    before = shared_files()
    prompt = ids(tokenizer, PROMPTS[1])
    original = await child.generate(prompt, GREEDY)
    changed = {name: tensor * 0.5 for name, tensor in llama.state_dict().items()}
    for version in (1, 2, 3):  # the first copy maps a new buffer; the others reuse it
        await child.load_weights(changed, version)
    assert child.policy_version == 3
    assert shared_files() == before  # the buffer's name is gone once the child has mapped it
    halved = await child.generate(prompt, GREEDY)
    reference = Engine(copy.deepcopy(llama), tokenizer, max_batch_size=8, max_seq_len=128, seed=0).start()
    try:
        await reference.load_weights(changed, 3)
        expected = await reference.generate(prompt, GREEDY)
    finally:
        reference.stop()
    assert halved.token_ids == expected.token_ids != original.token_ids
    assert halved.policy_version == 3
    # A safetensors file works as well, and the original weights come back exactly.
    path = tmp_path / "weights.safetensors"
    save_file({k: v.clone() for k, v in llama.state_dict().items()}, str(path))
    await child.load_weights(path, 4)
    again = await child.generate(prompt, GREEDY)
    assert (again.token_ids, again.policy_version) == (original.token_ids, 4)


async def test_errors_keep_their_types(child: EngineProcess, tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        await child.generate([10**6], GREEDY)
    with pytest.raises(InvalidRequestError, match="empty"):
        await child.generate([], GREEDY)
    with pytest.raises(InvalidRequestError, match=">= 0"):
        await child.load_weights({}, -1)
    version = child.policy_version
    with pytest.raises(InvalidRequestError):  # a state dict that doesn't fit the model
        await child.load_weights({"nope": torch.zeros(2)}, 9)
    assert child.policy_version == version
    # The child is still serving after all of that.
    assert (await child.generate(ids(tokenizer, PROMPTS[0]), GREEDY)).token_ids


async def test_a_cancelled_call_frees_its_slot(
    child: EngineProcess, tokenizer: PreTrainedTokenizerFast
) -> None:
    long = SamplingParams(temperature=1.0, max_tokens=100, seed=1)
    calls = [asyncio.create_task(child.generate(ids(tokenizer, PROMPTS[0]), long)) for _ in range(8)]
    await asyncio.sleep(0.05)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    # All 8 slots were taken; these would wait forever if the cancelled calls still held them.
    done = await asyncio.wait_for(
        asyncio.gather(*(child.generate(ids(tokenizer, p), GREEDY) for p in PROMPTS * 3)), timeout=60
    )
    assert len(done) == 9


async def test_requests_of_one_loop_pass_go_out_in_one_write(
    child: EngineProcess, tokenizer: PreTrainedTokenizerFast
) -> None:
    assert child._conn is not None
    conn = child._conn
    writes: list[int] = []
    send_bytes = conn.send_bytes

    def counting(data: bytes) -> None:
        writes.append(len(data))
        send_bytes(data)

    conn.send_bytes = counting  # type: ignore[method-assign]
    try:
        prompts = [ids(tokenizer, p) for p in PROMPTS * 2]
        together = await asyncio.gather(*(child.generate(p, GREEDY) for p in prompts))
    finally:
        conn.send_bytes = send_bytes  # type: ignore[method-assign]
    assert len(writes) == 1  # six requests, one message
    alone = [await child.generate(p, GREEDY) for p in prompts]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]


async def test_a_call_cancelled_before_its_request_is_written_is_cancelled_after_it(
    child: EngineProcess, tokenizer: PreTrainedTokenizerFast
) -> None:
    """A cancel goes out after its queued request (in the same write): were it first, the child
    would ignore it, then run the request to the end in a slot nobody waits on."""
    assert child._conn is not None
    conn = child._conn
    messages: list[tuple[object, ...]] = []
    send_bytes = conn.send_bytes

    def recording(data: bytes) -> None:
        messages.extend(pickle.loads(data))
        send_bytes(data)

    conn.send_bytes = recording  # type: ignore[method-assign]
    try:
        long = SamplingParams(temperature=1.0, max_tokens=100, seed=1)
        opened = [child._open(ids(tokenizer, PROMPTS[0]), long, streaming=False) for _ in range(8)]
        assert len(child._outbox) == 8 and not messages  # queued until the end of this loop pass
        for call_id, _ in opened:
            child._close(call_id, cancel=True)  # a cancel sent before the pass ends
        await asyncio.sleep(0.05)
    finally:
        conn.send_bytes = send_bytes  # type: ignore[method-assign]
    kinds = [(m[0], m[1]) for m in messages]
    gens = [call_id for kind, call_id in kinds if kind == "gen"]
    cancels = [call_id for kind, call_id in kinds if kind == "cancel"]
    assert len(gens) == 8 and sorted(cancels) == sorted(gens)
    assert all(kinds.index(("gen", i)) < kinds.index(("cancel", i)) for i in gens)
    assert not child._outbox
    done = await asyncio.wait_for(
        asyncio.gather(*(child.generate(ids(tokenizer, p), GREEDY) for p in PROMPTS * 3)), timeout=60
    )
    assert len(done) == 9


async def test_a_dead_child_fails_calls_instead_of_hanging(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast
) -> None:
    engine = EngineProcess(llama, tokenizer, max_batch_size=4, max_seq_len=2048)
    await asyncio.to_thread(engine.start)
    try:
        pending = asyncio.create_task(engine.generate(ids(tokenizer, PROMPTS[0]), LONG))
        await asyncio.sleep(0.1)
        assert engine.pid is not None
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(EngineError, match="exited unexpectedly"):
            await asyncio.wait_for(pending, timeout=30)
        with pytest.raises(EngineError, match="exited unexpectedly"):
            await engine.generate(ids(tokenizer, PROMPTS[0]), GREEDY)
    finally:
        engine.stop()


async def test_stop_fails_pending_calls(llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> None:
    engine = EngineProcess(llama, tokenizer, max_batch_size=4, max_seq_len=2048)
    await asyncio.to_thread(engine.start)
    pid = engine.pid
    pending = asyncio.create_task(engine.generate(ids(tokenizer, PROMPTS[0]), LONG))
    await asyncio.sleep(0.1)
    await asyncio.to_thread(engine.stop)
    with pytest.raises(EngineStoppedError):
        await asyncio.wait_for(pending, timeout=10)
    with pytest.raises(EngineStoppedError):
        await engine.generate(ids(tokenizer, PROMPTS[0]), GREEDY)
    assert pid is not None and not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_the_child_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    """A parent killed with SIGKILL can't stop its engine: the child must notice and exit."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from reinforge.engine import EngineProcess
            from reinforge.models import build_tokenizer, tiny_llama

            tok = build_tokenizer(["what is 1 plus 2? it is 3."] * 20, vocab_size=300)
            engine = EngineProcess(tiny_llama(tok, hidden_size=32, num_layers=1, intermediate_size=64), tok)
            engine.start()
            print(engine.pid, flush=True)
            time.sleep(120)
            """
        )
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert _alive(child_pid)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 20
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child_pid)
    finally:
        parent.kill()
        parent.wait(10)


async def test_a_released_cache_serves_the_same_outputs(
    child: EngineProcess, tokenizer: PreTrainedTokenizerFast
) -> None:
    """`release_cache` reaches the child's engine between calls without disturbing what it serves."""
    prompts = [ids(tokenizer, p) for p in PROMPTS]
    before = await asyncio.gather(*(child.generate(p, GREEDY) for p in prompts))
    child.release_cache()
    after = await asyncio.gather(*(child.generate(p, GREEDY) for p in prompts))
    assert [o.token_ids for o in after] == [o.token_ids for o in before]
    assert child.failure is None
