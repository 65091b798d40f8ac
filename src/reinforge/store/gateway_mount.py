"""The gateway that `reinforge store serve` mounts at `/gateway`: which backend it serves, and the hook
through which it is built.

Runners finish attempts through the gateway (`POST /gateway/finish`), and agents send their LLM calls,
rewards and OpenTelemetry traces there, so a served store without one leases work that never
finishes. The store layer can't import the gateway (it sits above it), so the gateway's builder is
handed in by the `reinforge` command (`reinforge.cli`), which assembles the layers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reinforge.store.protocol import Store
from reinforge.types import LeasedRollout

GATEWAY_MOUNT = "/gateway"


class GatewayBackendOptions(BaseModel):
    """At most one backend: an embedded engine on a model folder, an upstream vLLM/SGLang server, or
    scripted replies. None of them: the gateway finishes attempts and takes rewards and traces, and
    answers LLM calls with a 503 that says how to give it a model.

    Attributes:
        model_dir: a Hugging Face causal LM folder (weights, config, tokenizer) served by the
            embedded engine.
        upstream: the root URL of a vLLM or SGLang server (its API key: `$REINFORGE_UPSTREAM_API_KEY`).
        upstream_model: the model name the upstream server serves (required with `upstream`).
        upstream_flavor: "vllm" or "sglang".
        scripted: a JSON file holding a list of replies (strings, or `{"text", "tool_calls"}`),
            answered in turn: for wiring tests of agents, no model needed.
        model_name: the name agents' calls see (`--model` of the runners).
        max_batch_size / max_seq_len: the embedded engine's batch and sequence limits.
    """

    model_config = ConfigDict(extra="forbid")

    model_dir: Path | None = None
    upstream: str | None = None
    upstream_model: str | None = None
    upstream_flavor: Literal["vllm", "sglang"] = "vllm"
    scripted: Path | None = None
    model_name: str = "reinforge-policy"
    max_batch_size: int = Field(default=64, ge=1)
    max_seq_len: int = Field(default=2048, ge=16)

    @model_validator(mode="after")
    def _one_backend(self) -> GatewayBackendOptions:
        given = [
            name
            for name, value in (
                ("--model-dir", self.model_dir),
                ("--upstream", self.upstream),
                ("--scripted", self.scripted),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise ValueError(f"give at most one backend; got {' and '.join(given)}")
        if self.upstream is not None and not self.upstream_model:
            raise ValueError("--upstream needs --upstream-model (the model name that server serves)")
        return self

    @property
    def kind(self) -> str:
        if self.model_dir is not None:
            return f"embedded engine on {self.model_dir}"
        if self.upstream is not None:
            return f"{self.upstream_flavor} at {self.upstream} ({self.upstream_model})"
        if self.scripted is not None:
            return f"scripted replies from {self.scripted}"
        return "no model (LLM calls answer 503)"


class MountedGateway(Protocol):
    """A gateway ready to mount beside the store app, and what the server does with it."""

    app: Any
    """The ASGI app to mount at `/gateway`."""

    def leased(self, leased: list[LeasedRollout]) -> None:
        """Told of every batch leased through the store app (the gateway then knows the attempts)."""

    async def start(self) -> None:
        """Start the backend (load the engine) before the server accepts requests."""

    async def close(self) -> None:
        """Store the gateway's last spans and stop the backend."""


GatewayBuilder = Callable[[Store, str, GatewayBackendOptions], MountedGateway]
"""(the open store, the gateway secret, the backend options) -> the gateway to mount."""

_builder: GatewayBuilder | None = None


def use_gateway_builder(builder: GatewayBuilder) -> None:
    """Called by the `reinforge` command: how `store serve` builds its gateway."""
    global _builder
    _builder = builder


def gateway_builder() -> GatewayBuilder | None:
    return _builder
