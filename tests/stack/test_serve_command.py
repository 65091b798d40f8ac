"""`reinforge store serve` with a gateway backend, as a user runs it: a real process on 127.0.0.1 whose
gateway answers an agent's call, and how its options become `EngineSettings`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest

from reinforge.access import attempt_token
from reinforge.stack.cli import engine_settings_from_options
from reinforge.store.http.client import HttpStoreClient
from reinforge.types import RolloutSpec
from store.http.served import ServedStore


def test_a_served_store_with_scripted_replies_answers_an_agent(tmp_path: Path) -> None:
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["served reply"]))
    (tmp_path / "run").mkdir()
    served = ServedStore(tmp_path / "run", db="memory://", options=["--scripted", str(replies)])
    try:

        async def one_call() -> str:
            async with HttpStoreClient(served.url, served.token) as client:
                await client.enqueue_rollouts([RolloutSpec(task={"q": "hi"})])
                (leased,) = await client.lease_rollouts("test-runner", max_rollouts=1)
            attempt = leased.attempt.attempt_id
            secret = (tmp_path / "run" / "gateway.secret").read_text().strip()
            agent = openai.AsyncOpenAI(
                base_url=f"{served.url}/gateway/r/{attempt}/v1",
                api_key=attempt_token(secret, attempt),
                max_retries=0,
            )
            try:
                answer = await agent.chat.completions.create(
                    model="reinforge-policy", messages=[{"role": "user", "content": "hi"}], max_tokens=8
                )
            finally:
                await agent.close()
            return answer.choices[0].message.content or ""

        assert asyncio.run(one_call()) == "served reply"
    finally:
        served.terminate()
    assert not (tmp_path / "run" / "store.url").exists()  # a graceful shutdown takes its URL back
    printed = served.log.read_text()
    assert f"/gateway (scripted replies from {replies})" in printed
    assert "a runner joins with:\n    REINFORGE_STORE_TOKEN=" in printed


def test_serve_options_become_engine_settings(tmp_path: Path) -> None:
    none = dict(model_dir=None, upstream=None, upstream_model=None, scripted=None, max_batch_size=None)
    base = {**none, "upstream_flavor": "vllm", "model_name": "policy", "max_seq_len": None}
    assert engine_settings_from_options(**base).backend == "none"
    embedded = engine_settings_from_options(**{**base, "model_dir": tmp_path, "max_batch_size": 8})
    assert (embedded.backend, embedded.model_dir, embedded.max_batch_size, embedded.max_seq_len) == (
        "embedded",
        tmp_path,
        8,
        2048,
    )
    upstream = engine_settings_from_options(
        **{**base, "upstream": "http://h:1", "upstream_model": "m", "upstream_flavor": "sglang"}
    )
    assert (upstream.backend, upstream.url, upstream.served_model, upstream.model_name) == (
        "sglang",
        "http://h:1",
        "m",
        "policy",
    )
    with pytest.raises(ValueError, match="vllm or sglang, not 'tgi'"):
        engine_settings_from_options(
            **{**base, "upstream": "u", "upstream_model": "m", "upstream_flavor": "tgi"}
        )
    with pytest.raises(ValueError, match=r"\['max_seq_len'\] are the embedded engine's"):
        engine_settings_from_options(**{**base, "upstream": "u", "upstream_model": "m", "max_seq_len": 64})
