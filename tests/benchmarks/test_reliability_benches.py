"""benchmarks/load_bench.py and soak_bench.py: a small load run finishes with no errors and every
call recorded; the soak's figures come from the fits it claims (the soak itself takes an hour)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_small_load_run_has_no_errors_and_records_every_call() -> None:
    small = ["--agents", "20", "--seconds", "3", "--drivers", "1", "--think-ms", "100"]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "load_bench.py"), *small],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = re.search(r"^20 agents .*: (\d+) calls .*store: (\d+) LLM spans", done.stdout, re.M)
    assert summary is not None, done.stdout
    assert int(summary.group(1)) > 20 and summary.group(1) == summary.group(2)
    result = re.search(
        r"^RESULT load_errors=(\d+) load_p50_ms=([\d.]+) load_p99_ms=([\d.]+) ", done.stdout, re.M
    )
    assert result is not None, done.stdout
    assert int(result.group(1)) == 0
    assert 0 < float(result.group(2)) <= float(result.group(3))


def test_soak_fits_and_step_log(tmp_path: Path) -> None:
    soak = _module("soak_bench")
    assert soak._slope([0, 1000, 2000], [700.0, 705.0, 710.0]) == 0.005
    assert soak._slope([5, 5], [1.0, 2.0]) != soak._slope([5, 5], [1.0, 2.0])  # nan: no spread
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "val/success": 0.5}, {"step": 1, "time/step_s": 0.5}, {"step": 2, "time/step_s": 0.7}]
    metrics.write_text(
        "\n".join(json.dumps(r) for r in rows) + '\n{"step": 3, "time/st'
    )  # a line being written
    assert soak._steps_done(metrics) == (2, [0.5, 0.7])
    assert soak._steps_done(tmp_path / "absent.jsonl") == (0, [])


def _source_store(path: Path, groups: int = 3, group_size: int = 4) -> None:
    """A small store of finished rollouts with LLM and tool spans, as a demo run leaves one."""
    import asyncio

    from reinforge import semconv
    from reinforge.store.sql.store import SqlStore
    from reinforge.types import AttemptOutcome, AttemptStatus, RolloutSpec, Span

    async def build() -> None:
        store = await SqlStore.open(f"sqlite:///{path}")
        specs = [
            RolloutSpec(
                rollout_id=f"s-{g}-{k}", task={"question": f"{g}+{g}"}, task_id=str(g), group_id=f"s-{g}"
            )
            for g in range(groups)
            for k in range(group_size)
        ]
        await store.enqueue_rollouts(specs)
        for lr in await store.lease_rollouts("r", max_rollouts=len(specs)):
            a = lr.attempt
            call = Span(
                trace_id=a.attempt_id,
                rollout_id=a.rollout_id,
                attempt_id=a.attempt_id,
                name=semconv.SPAN_LLM_CALL,
                attributes={
                    semconv.ATTR_PROMPT_TOKEN_IDS: [1, 2, 3],
                    semconv.ATTR_COMPLETION_TOKEN_IDS: [4, 5],
                },
            )
            tool = Span(rollout_id=a.rollout_id, attempt_id=a.attempt_id, name="tool", parent_id=call.span_id)
            await store.add_spans([call, tool])
            reward = float(a.rollout_id.endswith("-0"))
            await store.finish_attempt(
                a.attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=reward)
            )
        await store.close()

    asyncio.run(build())


def test_store_size_replays_the_source_with_fresh_ids(tmp_path: Path) -> None:
    source = tmp_path / "source.db"
    _source_store(source, groups=8, group_size=8)
    size = _module("store_size_bench")
    import asyncio

    rollouts, _, spans = asyncio.run(size._read_source(source))
    assert len(rollouts) == 64 and sum(len(v) for v in spans.values()) == 128
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "store_size_bench.py"), "--source", str(source), "--rounds", "6"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "after round 6: " in done.stdout and " for 384 rollouts" in done.stdout, done.stdout
    result = re.search(
        r"^RESULT store_mb_per_1k_demo_steps=([\d.]+) store_bytes_per_rollout=(\d+) "
        r"store_small_file_mb_per_1k_demo_steps=([\d.]+)$",
        done.stdout,
        re.M,
    )
    assert result is not None, done.stdout
    # 64 rollouts in a fresh file: its fixed pages dominate, so the small-file figure is the larger.
    assert 0 < float(result.group(1)) < float(result.group(3))


def test_store_size_replay_keeps_each_rollouts_spans_and_reward(tmp_path: Path) -> None:
    import asyncio

    from reinforge.store.sql.store import SqlStore
    from reinforge.types import RolloutQuery, SpanQuery

    source = tmp_path / "source.db"
    _source_store(source, groups=2, group_size=2)
    size = _module("store_size_bench")
    rollouts, attempts, spans = asyncio.run(size._read_source(source))

    async def replay() -> None:
        store = await SqlStore.open(f"sqlite:///{tmp_path / 'replay.db'}")
        await size._replay_round(store, 7, rollouts, attempts, spans)
        page = await store.query_rollouts(RolloutQuery(limit=100))
        assert sorted(r.rollout_id for r in page.items) == sorted(f"r7-{r.rollout_id}" for r in rollouts)
        by_id = {f"r7-{r.rollout_id}": r for r in rollouts}
        for r in page.items:
            old = by_id[r.rollout_id]
            assert (r.reward, r.group_id, r.task) == (old.reward, f"r7-{old.group_id}", old.task)
            got = (await store.query_spans(SpanQuery(rollout_id=r.rollout_id))).items
            assert len(got) == 2 and got[1].name == "tool"
            call, tool = got
            assert call.trace_id == call.attempt_id and tool.parent_id == call.span_id
            old_call = spans[attempts[old.rollout_id][0].attempt_id][0]
            assert call.attributes == old_call.attributes and call.span_id != old_call.span_id
        await store.close()

    asyncio.run(replay())
