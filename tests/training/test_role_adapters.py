"""Per-role LoRA adapters: each adapter learns only from its role's transitions (the others and the
base stay bit-identical), roles without an adapter train nothing, the adapters reach the engine and
checkpoints whole, and a call to `/agents/writer/v1` is served with the writer's adapter."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from pydantic import ValidationError

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.algorithms import GRPO, compute_token_logprobs
from reinforge.engine import Engine
from reinforge.engine.engine_backend import EngineBackend
from reinforge.gateway import create_gateway_app
from reinforge.net.background import BackgroundServer
from reinforge.runner import LLM, agent
from reinforge.store.memory import MemoryStore
from reinforge.training import Trainer, TrainerConfig
from reinforge.training.checkpoint import latest_checkpoint, load_checkpoint
from reinforge.training.config import LoraSettings, OptimSettings
from reinforge.training.policy import Policy
from reinforge.types import RolloutSpec, SpanQuery, Transition

from .conftest import small_model
from .test_policy import transitions

ROLES = ["writer", "rewriter"]


def make_policy(tokenizer: Any, **optim: Any) -> tuple[Policy, Any]:
    """A policy with one adapter per role (and weight decay, which must not touch idle adapters),
    and a copy of the base model it started from."""
    model = small_model(tokenizer)
    base = copy.deepcopy(model)
    settings = OptimSettings(
        learning_rate=1e-2, weight_decay=0.1, lora=LoraSettings(r=4, alpha=8, roles=ROLES), **optim
    )
    with torch.random.fork_rng():  # peft draws lora_A from the global generator
        torch.manual_seed(0)
        policy = Policy(model, GRPO(group_size=8), settings, pad_token_id=tokenizer.pad_token_id)
    return policy, base


def of_role(batch: list[Transition], role: str | None) -> list[Transition]:
    return [t.model_copy(update={"agent_name": role}) for t in batch]


def snapshot(policy: Policy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.model.state_dict().items()}


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    """Which groups of weights moved: "base", or an adapter's name."""
    groups = set()
    for key, value in after.items():
        if not torch.equal(before[key], value):
            groups.add(next((role for role in ROLES if f".{role}." in key), "base"))
    return groups


def test_role_names_are_checked() -> None:
    for bad in ([], ["writer", "writer"], ["a.b"], ["x/y"], [""], ["lora"]):
        with pytest.raises(ValidationError):
            LoraSettings(roles=bad)
    assert LoraSettings(roles=["writer", "re-writer_2"]).roles == ["writer", "re-writer_2"]


def test_an_update_moves_only_the_adapters_of_its_roles(tokenizer: Any) -> None:
    policy, _ = make_policy(tokenizer)
    batch = transitions(policy.model, tokenizer.pad_token_id)
    before = snapshot(policy)
    metrics = policy.update(of_role(batch, "writer"))
    assert changed(before, snapshot(policy)) == {"writer"}
    assert metrics["update/transitions/writer"] == 8 and metrics["update/transitions_without_adapter"] == 0

    # Now the writer has AdamW state; a rewriter-only step still leaves it (and the base) untouched.
    before = snapshot(policy)
    policy.update(of_role(batch, "rewriter"))
    assert changed(before, snapshot(policy)) == {"rewriter"}

    # Roles without an adapter (a frozen checker, or no name at all) train nothing.
    before = snapshot(policy)
    metrics = policy.update(of_role(batch, "checker") + of_role(batch[:3], None))
    assert metrics["update/skipped"] == 1.0 and metrics["update/transitions_without_adapter"] == 11
    assert changed(before, snapshot(policy)) == set()
    metrics = policy.update(of_role(batch, "checker") + of_role(batch, "writer"))
    assert metrics["update/transitions_without_adapter"] == 8 and metrics["update/transitions"] == 8
    assert changed(before, snapshot(policy)) == {"writer"}


def test_each_role_is_trained_as_its_own_batch(tokenizer: Any) -> None:
    """A step over two roles moves each adapter as a step over that role alone would (up to float
    rounding and the shared gradient clip, off here): the roles' losses do not mix."""
    batch = transitions(small_model(tokenizer), tokenizer.pad_token_id)
    mixed, _ = make_policy(tokenizer, max_grad_norm=None)
    alone, _ = make_policy(tokenizer, max_grad_norm=None)
    mixed.update(of_role(batch[:4], "writer") + of_role(batch[4:], "rewriter"))
    alone.update(of_role(batch[:4], "writer"))
    writer = {k: v for k, v in snapshot(mixed).items() if ".writer." in k}
    for key, value in snapshot(alone).items():
        if key in writer:
            # Adam normalises the gradient's scale (the role's share of the batch) away.
            assert (writer[key] - value).abs().max() < 1e-4, key


def test_engine_state_and_checkpoints_carry_every_adapter(tokenizer: Any) -> None:
    policy, base = make_policy(tokenizer)
    batch = transitions(policy.model, tokenizer.pad_token_id)
    policy.update(of_role(batch, "writer") + of_role(batch, "rewriter"))

    state = policy.engine_state()
    base_state = base.state_dict()
    plain = {k: v for k, v in state.items() if not k.startswith("lora/")}
    assert plain.keys() == base_state.keys()  # the base in its own names, unmerged
    assert all(torch.equal(plain[k], base_state[k]) for k in plain)
    adapted = {k.split("/")[1] for k in state if k.startswith("lora/")}
    assert adapted == set(ROLES)
    key = "lora/writer/model.layers.0.self_attn.q_proj"
    assert state[f"{key}.lora_A"].shape == (4, 32) and state[f"{key}.lora_B"].shape == (32, 4)
    assert float(state[f"{key}.scale"]) == 2.0

    saved = copy.deepcopy(policy.state_dict())
    resumed, _ = make_policy(tokenizer)
    resumed.load_state_dict(saved)
    assert changed(snapshot(policy), snapshot(resumed)) == set()
    # The optimiser state came back too: the next step is the same step.
    policy.update(of_role(batch, "writer"))
    resumed.update(of_role(batch, "writer"))
    for key, value in snapshot(policy).items():
        assert torch.allclose(value, snapshot(resumed)[key], atol=1e-6), key


def teacher_forced(
    policy: Policy, role: str | None, prompt: list[int], completion: list[int]
) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    mask = torch.tensor([[0.0] * len(prompt) + [1.0] * len(completion)])
    peft_model: Any = policy.model
    with torch.no_grad():
        if role is None:
            with peft_model.disable_adapter():
                lp = compute_token_logprobs(peft_model, ids, torch.ones_like(ids), mask).logprobs
        else:
            peft_model.set_adapter(role)
            lp = compute_token_logprobs(peft_model, ids, torch.ones_like(ids), mask).logprobs
    return lp[0, len(prompt) :]


async def test_a_writer_call_through_the_gateway_is_served_with_the_writer_adapter(tokenizer: Any) -> None:
    policy, base = make_policy(tokenizer)
    # Trained adapters (not peft's all-zero start), so each role's distribution is its own.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3, generator=gen)
    secret = "role-adapters-secret"
    store = MemoryStore()
    with Engine(base, tokenizer, max_batch_size=4, seed=0, max_seq_len=256) as engine:
        await engine.load_weights(policy.engine_state(), version=1)
        app = create_gateway_app(store, EngineBackend(engine, tokenizer), secret)
        with BackgroundServer(app) as server:
            await store.enqueue_rollouts([RolloutSpec(task={"q": "2+3"})])
            attempt_id = (await store.lease_rollouts("test-runner", max_rollouts=1))[0].attempt.attempt_id
            for agent in ("writer", "checker"):
                client = openai.AsyncOpenAI(
                    base_url=f"{server.url}/r/{attempt_id}/agents/{agent}/v1",
                    api_key=attempt_token(secret, attempt_id),
                    max_retries=0,
                )
                await client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": "What is 2+3?"}], max_tokens=10
                )
                await client.close()
            await app.state.gateway.flush(attempt_id)
            spans = (await store.query_spans(SpanQuery(attempt_id=attempt_id))).items
        stats = engine.stats()
    assert (stats["adapter_sequences/writer"], stats["adapter_sequences/"]) == (1, 1)
    recorded = {s.attributes[semconv.ATTR_AGENT_NAME]: s.attributes for s in spans}
    served: dict[str, torch.Tensor] = {}
    for agent, role in (("writer", "writer"), ("checker", None)):
        attrs = recorded[agent]
        prompt, completion = attrs[semconv.ATTR_PROMPT_TOKEN_IDS], attrs[semconv.ATTR_COMPLETION_TOKEN_IDS]
        logprobs = torch.tensor(attrs[semconv.ATTR_COMPLETION_LOGPROBS])
        assert torch.allclose(teacher_forced(policy, role, prompt, completion), logprobs, atol=1e-4), agent
        served[agent] = teacher_forced(policy, "rewriter", prompt, completion)
        # ...and not with another adapter's distribution.
        assert not torch.allclose(served[agent], logprobs, atol=1e-2), agent


@agent(name="writer_and_checker")
async def writer_and_checker(task: dict[str, Any], llm: LLM) -> float:
    """A writer drafts, a frozen checker reads the draft; reward 1 for an even-length draft."""
    sampling = llm.resources.get("sampling", {})
    texts = []
    for role in ("writer", "checker"):
        scoped = llm.for_agent(role)
        client = openai.AsyncOpenAI(base_url=scoped.base_url, api_key=scoped.api_key, max_retries=0)
        try:
            reply = await client.chat.completions.create(
                model=scoped.model,
                messages=[{"role": "user", "content": str(task["question"]) + "".join(texts)}],
                temperature=float(sampling.get("temperature", 1.0)),
                max_tokens=6,
            )
        finally:
            await client.close()
        texts.append(reply.choices[0].message.content or "")
    return float(len(texts[0]) % 2 == 0)


def test_a_training_run_with_per_role_adapters(tokenizer: Any, tmp_path: Path) -> None:
    config = TrainerConfig(
        run_dir=tmp_path,
        progress=False,
        optim={"learning_rate": 1e-2, "lora": {"r": 4, "alpha": 8, "roles": ROLES}},
        rollouts={"tasks_per_step": 2, "max_tokens": 6},
        runners={"concurrency": 16},
        engine={"max_batch_size": 16, "max_seq_len": 128},
        schedule={"max_steps": 1, "val_every": 0},
        checkpoints={"every": 1},
    )
    train = [{"task_id": f"t{i}", "question": f"{i}+{i}*2"} for i in range(8)]
    trainer = Trainer(small_model(tokenizer), tokenizer, algorithm=GRPO(group_size=4), config=config)
    result = trainer.fit(writer_and_checker, train)
    assert result.policy_version == 1
    step = next(r for r in result.history if "train/reward" in r)
    assert step["update/transitions/writer"] == 8 and step["update/transitions_without_adapter"] == 8
    _, state, _ = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))  # type: ignore[arg-type]
    b = {role: [v for k, v in state["model"].items() if f"lora_B.{role}." in k] for role in ROLES}
    assert b["writer"] and any(bool(v.any()) for v in b["writer"])  # the writer trained
    assert b["rewriter"] and not any(bool(v.any()) for v in b["rewriter"])  # no rewriter calls
