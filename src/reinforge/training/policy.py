"""The policy update: any Hugging Face causal LM, full or LoRA, trained on transitions with advantages.

One `update` is one optimiser step per epoch over a step's transitions: micro-batches by token budget,
gradients accumulated with loss scales computed once over the whole batch (so the result does not
depend on how the batch was split), the clipped policy-gradient loss from `reinforge.algorithms` with
the gateway's behaviour logprobs, and for PPO a value head trained alongside.

Two shortcuts leave the gradient unchanged (up to float summation order): rows that share a prompt (a
GRPO group) encode it once (`reinforge.algorithms.shared_prefix`), and, when nothing but the
policy-gradient term is optimised (no KL penalty, no value head), rows with a zero advantage (flat
groups) skip the forward pass, since every token of theirs has zero loss. Their tokens still count in
the loss scales; the diagnostic means (entropy, clip fractions, ratios) are over the rows trained.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import PreTrainedModel

from reinforge.algorithms import (
    PPO,
    Algorithm,
    TokenBatch,
    ValueHead,
    collate_transitions,
    compute_token_logprobs,
    loss_scales,
    policy_loss,
    value_loss,
)
from reinforge.algorithms.logprobs import TokenLogprobs
from reinforge.algorithms.shared_prefix import shared_prefix_logprobs
from reinforge.errors import InvalidRequestError
from reinforge.training.config import LoraSettings, OptimSettings
from reinforge.training.microbatch import micro_batches
from reinforge.types import Transition

_ADDITIVE = frozenset({"loss/policy", "loss/total", "value/loss", "tokens"})


def _fused_adamw_supported(params: Sequence[torch.nn.Parameter]) -> bool:
    """Whether AdamW's fused kernel takes these parameters: one kernel for all of them instead of
    a dozen small ops per parameter, with the same result up to float rounding (docs/training.md
    has the measurement), on every step, flat batches included."""
    return bool(params) and all(
        p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float16, torch.bfloat16)
        for p in params
    )


def wrap_lora(model: PreTrainedModel, settings: LoraSettings) -> torch.nn.Module:
    """Freeze `model` and add LoRA adapters (peft) on the configured projections."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in settings.target_modules if m not in present]
    if missing:
        raise InvalidRequestError(
            f"LoRA target modules {missing} are not in the model; it has e.g. {sorted(present)[:12]}"
        )
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


class Policy:
    """The trainable policy and its optimiser; see the module docstring."""

    def __init__(
        self,
        model: PreTrainedModel,
        algorithm: Algorithm,
        optim: OptimSettings,
        *,
        pad_token_id: int,
        temperature: float = 1.0,
        share_prompts: bool = True,
    ) -> None:
        """`temperature` is the rollouts' sampling temperature: logprobs are recomputed at it."""
        self.algorithm = algorithm
        self.share_prompts = share_prompts
        self.pad_token_id = pad_token_id
        self.max_grad_norm = optim.max_grad_norm
        self.micro_batch_tokens = optim.micro_batch_tokens
        self.epochs_per_batch = optim.epochs_per_batch
        self.temperature = temperature
        self.lora = lora = optim.lora
        self.model: torch.nn.Module = wrap_lora(model, lora) if lora is not None else model
        self.model.train()
        self.value_head: ValueHead | None = None
        if isinstance(algorithm, PPO):
            self.value_head = ValueHead(int(model.config.hidden_size))
        # The reference policy for the KL penalty is the starting policy, frozen. With LoRA it is the
        # base model with adapters disabled, so no copy is needed.
        self._reference: torch.nn.Module | None = None
        if algorithm.kl_coef > 0 and lora is None:
            self._reference = copy.deepcopy(model).eval().requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(
            params,
            lr=optim.learning_rate,
            weight_decay=optim.weight_decay,
            fused=_fused_adamw_supported(params) or None,
        )

    # ---- weights for the engine and for checkpoints ---------------------------------------------

    def engine_state(self) -> dict[str, torch.Tensor]:
        """Weights in the base model's names, as the engine loads them (LoRA merged in)."""
        if self.lora is None:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        merged = copy.deepcopy(self.model).merge_and_unload()  # type: ignore[operator]
        return {k: v.detach() for k, v in merged.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # loading restores the saving optimiser's flag
            group["fused"] = self.optimizer.defaults["fused"]
        if self.value_head is not None:
            if state.get("value_head") is None:
                raise InvalidRequestError("the checkpoint has no value head, but the algorithm is PPO")
            self.value_head.load_state_dict(state["value_head"])

    # ---- PPO's critic ----------------------------------------------------------------------------

    @torch.no_grad()
    def values(self, transitions: Sequence[Transition]) -> list[float]:
        """The value head's estimate for each transition's state (its last prompt token)."""
        if self.value_head is None:
            raise InvalidRequestError(f"{type(self.algorithm).__name__} has no value head")
        out = [0.0] * len(transitions)
        for indices in micro_batches(transitions, self.micro_batch_tokens):
            batch = collate_transitions([transitions[i] for i in indices], self.pad_token_id)
            lp = compute_token_logprobs(
                self.model,
                batch.input_ids,
                batch.attention_mask,
                batch.response_mask,
                with_hidden_states=True,
            )
            assert lp.hidden_states is not None
            values = self.value_head(lp.hidden_states, batch.prompt_lengths - 1)
            for row, i in enumerate(indices):
                out[i] = float(values[row])
        return out

    # ---- the update ------------------------------------------------------------------------------

    @contextmanager
    def _reference_model(self) -> Iterator[torch.nn.Module]:
        if self._reference is not None:
            yield self._reference
            return
        with self.model.disable_adapter():  # type: ignore[operator]
            yield self.model

    def set_learning_rate(self, learning_rate: float) -> None:
        """The learning rate of the next updates (a schedule sets it before each step)."""
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate

    def update(
        self, transitions: Sequence[Transition], returns: Sequence[float] | None = None
    ) -> dict[str, float]:
        """One optimiser step per epoch over `transitions` (advantages filled); returns metrics.

        `returns` are PPO's value targets, aligned with `transitions`.
        """
        trained = [t for t in transitions if any(t.response_mask)]
        if not trained:
            return {"update/skipped": 1.0}
        if any(t.advantage is None for t in trained):
            raise InvalidRequestError("every transition needs an advantage before the policy update")
        if self.value_head is not None and (returns is None or len(returns) != len(transitions)):
            raise InvalidRequestError("PPO's update needs one value target (return) per transition")
        targets = (
            [r for t, r in zip(transitions, returns, strict=True) if any(t.response_mask)]
            if returns is not None
            else None
        )
        scales = loss_scales(trained, self.algorithm)
        total_tokens = float(sum(sum(t.response_mask) for t in trained))
        # Rows whose every token has zero loss and zero gradient need no forward (module docstring).
        pg_only = self.algorithm.kl_coef == 0 and self.value_head is None
        active = [i for i, t in enumerate(trained) if not (pg_only and t.advantage == 0.0)]
        skipped = len(trained) - len(active)
        groups = [
            [active[j] for j in g]
            for g in micro_batches([trained[i] for i in active], self.micro_batch_tokens)
        ]
        old: dict[int, torch.Tensor] = {}
        old_values: dict[int, torch.Tensor] = {}
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        self.model.train()
        grad_norm = 0.0
        for epoch in range(self.epochs_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            for g, indices in enumerate(groups):
                metrics = self._micro_step(trained, indices, scales, targets, g, epoch, old, old_values)
                tokens = metrics.get("tokens", 0.0)
                for key, value in metrics.items():
                    if key == "tokens" or key in _ADDITIVE:
                        # Already scaled parts of the batch's loss: they add up across micro-batches.
                        sums[key] = sums.get(key, 0.0) + value
                        continue
                    # Everything else: token-weighted means over the micro-batches.
                    sums[key] = sums.get(key, 0.0) + value * tokens
                    weights[key] = weights.get(key, 0.0) + tokens
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            if not groups:
                # Every row was skipped: their gradient is zero, and AdamW still takes its step
                # (momentum moves the weights even on a zero gradient), as it would after a forward.
                for p in params:
                    p.grad = torch.zeros_like(p)
            if self.max_grad_norm is not None:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
            else:
                grad_norm = float(
                    torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
                )
            if not math.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise InvalidRequestError("the policy gradient is not finite; lower the learning rate")
            self.optimizer.step()
        self.model.eval()
        epochs = self.epochs_per_batch
        out = {k: (v / weights[k] if weights.get(k) else v / epochs) for k, v in sums.items()}
        out["update/grad_norm"] = grad_norm
        out["tokens"] = total_tokens
        out["update/micro_batches"] = float(len(groups))
        out["update/transitions"] = float(len(trained))
        out["update/rows_without_signal"] = float(skipped)
        return out

    def _logprobs(
        self, model: torch.nn.Module, batch: TokenBatch, with_entropy: bool = False
    ) -> TokenLogprobs:
        """Token logprobs of `batch`, each shared prompt encoded once when that saves work."""
        if self.share_prompts and self.value_head is None:
            shared = shared_prefix_logprobs(
                model, batch, temperature=self.temperature, with_entropy=with_entropy
            )
            if shared is not None:
                return shared
        return compute_token_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.response_mask,
            temperature=self.temperature,
            with_entropy=with_entropy,
            with_hidden_states=self.value_head is not None,
        )

    def _micro_step(
        self,
        trained: Sequence[Transition],
        indices: list[int],
        scales: Sequence[float],
        targets: Sequence[float] | None,
        group: int,
        epoch: int,
        old: dict[int, torch.Tensor],
        old_values: dict[int, torch.Tensor],
    ) -> dict[str, float]:
        batch = collate_transitions([trained[i] for i in indices], self.pad_token_id)
        lp = self._logprobs(self.model, batch, with_entropy=True)
        # π_old is the policy before this update: the first epoch's own forward pass, so no extra one.
        if epoch == 0:
            old[group] = lp.logprobs.detach()
        ref = None
        if self.algorithm.kl_coef > 0:
            with torch.no_grad(), self._reference_model() as reference:
                ref = self._logprobs(reference, batch).logprobs
        scale = torch.tensor([scales[i] for i in indices], dtype=torch.float32)
        loss, metrics = policy_loss(
            lp.logprobs,
            batch.behaviour_logprobs,
            batch.advantages,
            batch.response_mask,
            self.algorithm,
            old_logprobs=old[group],
            ref_logprobs=ref,
            scales=scale,
            entropy=lp.entropy,
        )
        if self.value_head is not None and isinstance(self.algorithm, PPO):
            assert lp.hidden_states is not None and targets is not None
            values = self.value_head(lp.hidden_states, batch.prompt_lengths - 1)
            if epoch == 0:
                old_values[group] = values.detach()
            v_loss, v_metrics = value_loss(
                values,
                torch.tensor([targets[i] for i in indices]),
                self.algorithm,
                old_values=old_values[group],
                scales=torch.full((len(indices),), 1.0 / len(trained)),
            )
            loss = loss + v_loss
            metrics.update(v_metrics)
        loss.backward()
        return metrics
