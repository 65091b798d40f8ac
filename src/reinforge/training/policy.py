"""The policy update: any Hugging Face causal LM, full or LoRA, trained on transitions with advantages.

One `update` is one optimiser step per epoch over a step's transitions: micro-batches by token budget,
gradients accumulated with loss scales computed once over the whole batch (so the result does not
depend on how the batch was split), the clipped policy-gradient loss from `reinforge.algorithms` with
the gateway's behaviour logprobs, and for PPO a value head trained alongside.

With `lora.roles` there is one adapter per role on one frozen base: each adapter is trained only on
its role's transitions (the loss aggregated within the role as `loss_agg` says, each role weighted by
its share of the trained transitions), transitions of roles without an adapter are skipped, and an
adapter with no transitions in a step gets no gradient, so AdamW leaves it bit-identical.

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
from reinforge.engine.adapters import lora_key
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
    """Freeze `model` and add LoRA adapters (peft) on the configured projections: one, or with
    `settings.roles` one per role, named after it."""
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
    if not settings.roles:
        return get_peft_model(model, config)
    wrapped = get_peft_model(model, config, adapter_name=settings.roles[0])
    for role in settings.roles[1:]:
        wrapped.add_adapter(role, config)
    return wrapped


def _adapter_of(parameter_name: str) -> str | None:
    """The adapter a peft parameter belongs to (`...q_proj.lora_A.<adapter>.weight`), or None."""
    parts = parameter_name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.startswith("lora_"):
            return parts[i + 1]
    return None


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
        self.roles: list[str] = list(lora.roles) if lora is not None and lora.roles else []
        """One adapter per role (empty: the full model, or one shared adapter)."""
        self._role_params: dict[str, list[torch.nn.Parameter]] = {role: [] for role in self.roles}
        if self.roles:
            for name, p in self.model.named_parameters():
                role = _adapter_of(name)
                if role in self._role_params:
                    p.requires_grad_(True)  # peft leaves only the active adapter trainable
                    self._role_params[role].append(p)
        self.model.train()
        self.value_head: ValueHead | None = None
        if isinstance(algorithm, PPO):
            self.value_head = ValueHead(int(model.config.hidden_size))
        # The reference policy for the KL penalty is the starting policy, frozen. With LoRA it is the
        # base model with adapters disabled, so no copy is needed.
        self._reference: torch.nn.Module | None = None
        if algorithm.kl_coef > 0 and lora is None:
            self._reference = copy.deepcopy(model).eval().requires_grad_(False)
        if self.roles:
            params = [p for role in self.roles for p in self._role_params[role]]
        else:
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
        """Weights in the base model's names, as the engine loads them: one shared LoRA adapter is
        merged in; per-role adapters are not (the engine applies each call's own) and come as
        `lora/<role>/<module path>.lora_A|lora_B|scale` (`reinforge.engine.adapters`)."""
        if self.lora is None:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        peft_model: Any = self.model
        if not self.roles:
            merged = copy.deepcopy(peft_model).merge_and_unload()
            return {k: v.detach() for k, v in merged.state_dict().items()}
        from peft.tuners.lora import LoraLayer

        inner: torch.nn.Module = peft_model.get_base_model()
        state = {
            k.replace(".base_layer.", "."): v.detach()
            for k, v in inner.state_dict().items()
            if ".lora_" not in k
        }
        for path, layer in inner.named_modules():
            if not isinstance(layer, LoraLayer):
                continue
            module: Any = layer
            for role in self.roles:
                if role in module.lora_A:
                    state[lora_key(role, path, "lora_A")] = module.lora_A[role].weight.detach()
                    state[lora_key(role, path, "lora_B")] = module.lora_B[role].weight.detach()
                    state[lora_key(role, path, "scale")] = torch.tensor(float(module.scaling[role]))
        return state

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
        for role, members in self._by_role(transitions, with_base=True):
            with self._serving(role):
                for part in micro_batches([transitions[i] for i in members], self.micro_batch_tokens):
                    indices = [members[j] for j in part]
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

    # ---- per-role adapters -----------------------------------------------------------------------

    def _by_role(
        self, transitions: Sequence[Transition], *, with_base: bool = False
    ) -> list[tuple[str | None, list[int]]]:
        """Indices of `transitions` per adapter, in `roles` order (None: every transition when there
        are no per-role adapters; with `with_base`, the transitions of roles without an adapter)."""
        if not self.roles:
            return [(None, list(range(len(transitions))))]
        parts: list[tuple[str | None, list[int]]] = []
        for role in self.roles:
            members = [i for i, t in enumerate(transitions) if t.agent_name == role]
            if members:
                parts.append((role, members))
        if with_base:
            rest = [i for i, t in enumerate(transitions) if t.agent_name not in self._role_params]
            if rest:
                parts.append((None, rest))
        return parts

    @contextmanager
    def _serving(self, role: str | None) -> Iterator[None]:
        """The model as `role` runs: its adapter active, or (a role without one) the plain base."""
        peft_model: Any = self.model
        if not self.roles:
            yield
        elif role is None:
            with peft_model.disable_adapter():
                yield
        else:
            peft_model.set_adapter(role)
            yield

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

        `returns` are PPO's value targets, aligned with `transitions`. With per-role adapters, only
        the transitions of roles that have one are trained (`update/transitions_without_adapter`
        counts the others).
        """
        kept = [i for i, t in enumerate(transitions) if any(t.response_mask)]
        without_adapter = 0
        if self.roles:
            with_adapter = [i for i in kept if transitions[i].agent_name in self._role_params]
            without_adapter = len(kept) - len(with_adapter)
            kept = with_adapter
        trained = [transitions[i] for i in kept]
        role_metrics = {"update/transitions_without_adapter": float(without_adapter)} if self.roles else {}
        if not trained:
            return {"update/skipped": 1.0, **role_metrics}
        if any(t.advantage is None for t in trained):
            raise InvalidRequestError("every transition needs an advantage before the policy update")
        if self.value_head is not None and (returns is None or len(returns) != len(transitions)):
            raise InvalidRequestError("PPO's update needs one value target (return) per transition")
        targets = [returns[i] for i in kept] if returns is not None else None
        parts = self._by_role(trained)
        # Each role's loss aggregates within the role, weighted by its share of the transitions
        # (one part, weight 1, without per-role adapters).
        scales = [0.0] * len(trained)
        for _, members in parts:
            share = len(members) / len(trained)
            within = loss_scales([trained[i] for i in members], self.algorithm)
            for i, scale in zip(members, within, strict=True):
                scales[i] = scale * share
        total_tokens = float(sum(sum(t.response_mask) for t in trained))
        # Rows whose every token has zero loss and zero gradient need no forward (module docstring).
        pg_only = self.algorithm.kl_coef == 0 and self.value_head is None
        groups: list[tuple[str | None, list[int]]] = []
        skipped = 0
        for role, members in parts:
            active = [i for i in members if not (pg_only and trained[i].advantage == 0.0)]
            skipped += len(members) - len(active)
            groups += [
                (role, [active[j] for j in g])
                for g in micro_batches([trained[i] for i in active], self.micro_batch_tokens)
            ]
        # What this step moves: the adapters of the roles it has transitions of (others keep no
        # gradient, so AdamW skips them: no momentum, no weight decay), or every parameter.
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if self.roles:
            params = [p for role, _ in parts if role is not None for p in self._role_params[role]]
            if self.value_head is not None:
                params += list(self.value_head.parameters())
        flat = {role for role, _ in parts} - {role for role, _ in groups}
        old: dict[int, torch.Tensor] = {}
        old_values: dict[int, torch.Tensor] = {}
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        self.model.train()
        grad_norm = 0.0
        for epoch in range(self.epochs_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            for g, (role, indices) in enumerate(groups):
                with self._serving(role):
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
            for role in flat:
                # Every row of this part was skipped: its gradient is zero, and AdamW still takes its
                # step (momentum moves the weights even on a zero gradient), as after a forward.
                for p in params if role is None else self._role_params[role]:
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
        out.update(role_metrics)
        for role, members in parts:
            if role is not None:
                out[f"update/transitions/{role}"] = float(len(members))
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
