"""What serves the policy to the agents, as one validated model: `[trainer.engine]` in a run file and
the backend options of `reinforge store serve` are both this.

Importing it costs no torch: `reinforge store serve` validates its options before anything heavy loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

MODEL_NAME = "reinforge-policy"
"""The model name agents' calls see by default (the runners' `--model`)."""

BackendKind = Literal["embedded", "vllm", "sglang", "scripted", "none"]

_EMBEDDED_ONLY = ("max_batch_size", "max_seq_len", "process", "retain_prefixes", "speculative_ngram")
_UPSTREAM_ONLY = ("url", "weights_dir")


class EngineSettings(BaseModel):
    """What serves the policy: the embedded engine, a vLLM / SGLang server (which a trainer syncs
    weights into after each update, docs/upstream.md), scripted replies, or no model at all.

    Attributes:
        backend: "embedded" (the engine in this process, the default), "vllm" or "sglang" (a server
            at `url`, started by the user on the starting model), "scripted" (the replies in the
            `scripted` file, in turn: wiring tests of agents) or "none" (LLM calls answer 503; the
            gateway still finishes attempts and takes rewards and traces).
        model_dir: the model folder the embedded engine loads (`reinforge store serve --model-dir`);
            None: the model is handed in code (the trainer's own).
        scripted: a JSON file holding a list of replies (strings, or `{"text", "tool_calls"}`).
        model_name: the name agents' calls see (the runners' `--model`).
        url: the upstream server's root (e.g. http://127.0.0.1:8000).
        served_model: the model name the server answers to (vLLM's `--served-model-name`).
        api_key: the server's API key, if it was started with one; None reads
            `$REINFORGE_UPSTREAM_API_KEY`.
        sync: "full" writes every weight (safetensors) and has the server reload them; "lora" writes
            the LoRA adapter (peft `save_pretrained`) and hot-loads it under a versioned name
            (`policy-v<N>`); it needs `optim.lora` with one shared adapter.
        weights_dir: a folder the trainer writes and the server reads (the same path on both, e.g.
            a shared disk). vLLM's full sync reloads the folder it was started from, so for vLLM this
            is that folder. Training against a server needs it; serving alone does not.
        sync_timeout_s: the most one sync call may take.
        on_sync_failure: "stop" ends the run on a failed sync; "retry" tries `sync_retries` more
            times, `sync_retry_delay_s` apart, before stopping. The old version keeps serving meanwhile.
        max_batch_size: sequences the engine decodes together.
        max_seq_len: the longest prompt + completion the engine serves (sizes its KV cache).
        process: run the engine in its own child process (`EngineProcess`), so its scheduling loop
            does not share the interpreter lock with the gateway and store that answer the agents.
            Off by default: on a machine with few cores the CPU, not the lock, is what runs out, and
            a third busy process slows the step (docs/training.md); it is for machines with cores
            to spare.
        retain_prefixes: keep finished calls' KV caches in free slots so a later prompt that extends
            one (an agent's next call, another request on the same schema) copies it (docs/engine.md).
        speculative_ngram: the most draft tokens a sequence verifies per decode step, looked up in its
            own prompt and output (0: off); outputs and logprobs are unchanged (docs/engine.md,
            "Speculative decoding").
    """

    model_config = ConfigDict(extra="forbid")

    backend: BackendKind = "embedded"
    model_dir: Path | None = None
    scripted: Path | None = None
    model_name: str = MODEL_NAME
    max_batch_size: int = Field(default=64, ge=1)
    max_seq_len: int = Field(default=512, ge=16)
    process: bool = False
    retain_prefixes: bool = True
    speculative_ngram: int = Field(default=0, ge=0)
    url: str | None = None
    served_model: str = MODEL_NAME
    api_key: SecretStr | None = None
    sync: Literal["full", "lora"] = "full"
    weights_dir: Path | None = None
    sync_timeout_s: float = Field(default=600.0, gt=0)
    on_sync_failure: Literal["stop", "retry"] = "stop"
    sync_retries: int = Field(default=2, ge=1)
    sync_retry_delay_s: float = Field(default=5.0, ge=0)

    @property
    def upstream(self) -> bool:
        return self.backend in ("vllm", "sglang")

    @model_validator(mode="after")
    def _settings_fit_the_backend(self) -> EngineSettings:
        # Compared with the defaults, not `model_fields_set`: `Trainer` re-validates a dumped config.
        def changed(names: tuple[str, ...]) -> list[str]:
            return [k for k in names if getattr(self, k) != EngineSettings.model_fields[k].default]

        if not self.upstream:
            named = changed((*_UPSTREAM_ONLY, "sync"))
            if named:
                raise ValueError(
                    f"engine settings {named} are for backend 'vllm' or 'sglang'; the {self.backend} "
                    "backend takes no server (set engine.backend, or leave them out)"
                )
        if self.backend != "embedded":
            named = changed(("model_dir", *_EMBEDDED_ONLY))
            if named:
                where = "set them on the server (docs/upstream.md)" if self.upstream else "leave them out"
                raise ValueError(
                    f"engine settings {named} are the embedded engine's; with engine.backend = "
                    f"{self.backend!r} {where}"
                )
        if (self.backend == "scripted") != (self.scripted is not None):
            raise ValueError("engine.scripted (a JSON file of replies) goes with engine.backend = 'scripted'")
        if self.upstream and self.url is None:
            raise ValueError(
                f"engine.backend = {self.backend!r} needs ['url']: the server's root URL (docs/upstream.md)"
            )
        if self.weights_dir is not None and not self.weights_dir.is_absolute():
            raise ValueError(
                f"engine.weights_dir must be an absolute path (got {str(self.weights_dir)!r}): the server "
                "reads the folder at the path the trainer names"
            )
        return self

    def describe(self) -> str:
        """What serves, in a few words (`reinforge store serve` prints it)."""
        if self.backend == "embedded":
            return f"embedded engine on {self.model_dir}" if self.model_dir else "embedded engine"
        if self.upstream:
            return f"{self.backend} at {self.url} ({self.served_model})"
        if self.backend == "scripted":
            return f"scripted replies from {self.scripted}"
        return "no model (LLM calls answer 503)"
