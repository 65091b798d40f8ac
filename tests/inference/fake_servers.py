"""Fake vLLM and SGLang servers that generate with a real tiny model on CPU and speak the recorded
request/response formats of the routes reinforge uses (tests/fixtures/upstream/weight_sync, with the
servers' code each shape was written after).

They exist to check weight sync: each server keeps the weights it serves, loads new ones from the
folders the trainer writes (safetensors, or a peft adapter), and records
- every generation: which weights produced each of its tokens (a call that straddled a switch would
  show two), and when it ran;
- every sync call: when it started and ended, and whether it applied.
Generation picks up the served weights afresh at every token and yields between tokens, so a switch
that lands while a call runs really does mix versions in that call. Tokens are sampled as the real
servers sample them (temperature, then top-k, then top-p over the top-k renormalised) and reported
with the logprobs each server returns (`returned_logprobs`: vLLM's `--logprobs-mode`, SGLang's
SGLANG_RETURN_ORIGINAL_LOGPROB).

A failure can be queued per route (`fail(path, mode)`): "error" answers HTTP 500, "refuse" answers
the server's own refusal (vLLM's 400 ErrorResponse, SGLang's `success: false`), "hang" answers only
after `hang_s`; none of them changes the weights served.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from inference.reference_sampling import processed_logprobs, sglang_logprobs

FORMATS = Path(__file__).parent.parent / "fixtures" / "upstream" / "weight_sync"


def recorded(server: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FORMATS / f"{server}.json").read_text())
    return data


@dataclass
class Weights:
    """One set of weights a server can serve, and the tag every token it produces is recorded with."""

    model: Any
    tag: str


@dataclass
class CallRecord:
    start: float
    end: float
    tags: list[str]
    """The weights that produced each completion token."""


@dataclass
class SyncRecord:
    path: str
    start: float
    end: float
    applied: bool


@dataclass
class FakeServer:
    """What the vLLM and SGLang fakes share: the model, generation, and the records."""

    model: Any
    tokenizer: Any
    served_model: str = "reinforge-policy"
    token_delay_s: float = 0.002
    hang_s: float = 2.0
    calls: list[CallRecord] = field(default_factory=list)
    syncs: list[SyncRecord] = field(default_factory=list)
    requests: list[tuple[str, Any]] = field(default_factory=list)
    adapters: dict[str, Weights] = field(default_factory=dict)
    loads: int = 0
    _failures: dict[str, deque[str]] = field(default_factory=lambda: defaultdict(deque))

    def __post_init__(self) -> None:
        self.base = copy.deepcopy(self.model).eval()
        self.weights = Weights(self.base, "full-0")
        self.formats = recorded(self.server_kind)

    server_kind = "vllm"

    # -- test controls -----------------------------------------------------------------------------

    def fail(self, path: str, mode: str = "error") -> None:
        """The next call to `path` fails as `mode` says (module docstring)."""
        self._failures[path].append(mode)

    def served_tags(self) -> list[str]:
        """The weights tag of every call, in the order they ended (each call has exactly one when
        nothing mixed)."""
        return [sorted(set(c.tags))[0] if len(set(c.tags)) == 1 else "MIXED" for c in self.calls]

    def overlaps(self) -> list[tuple[CallRecord, SyncRecord]]:
        """Generations that ran while a sync call was being handled."""
        return [(c, s) for c in self.calls for s in self.syncs if c.start < s.end and s.start < c.end]

    # -- shared pieces -------------------------------------------------------------------------------

    async def _body(self, request: Request, route: str) -> tuple[dict[str, Any] | None, Response | None]:
        """The JSON body, refused (422, as the servers' pydantic models do) when it has keys the
        recorded request model does not accept or lacks required ones."""
        raw = await request.body()
        body = json.loads(raw) if raw else {}
        self.requests.append((request.url.path, body))
        spec = self.formats[route]["request"]
        unknown = sorted(set(body) - set(spec.get("allowed_keys", body)))
        missing = sorted(set(spec.get("required_keys", [])) - set(body))
        if unknown or missing:
            detail = [{"loc": ["body", k], "msg": "Extra inputs are not permitted"} for k in unknown]
            detail += [{"loc": ["body", k], "msg": "Field required"} for k in missing]
            return None, JSONResponse({"detail": detail}, status_code=422)
        return body, None

    async def _failure(self, path: str) -> str | None:
        queue = self._failures.get(path)
        mode = queue.popleft() if queue else None
        if mode == "hang":
            await asyncio.sleep(self.hang_s)
        return mode

    def _load_full(self, folder: Path) -> Weights:
        files = sorted(folder.glob("*.safetensors"))
        if not files or not (folder / "config.json").is_file():
            raise ValueError(f"no safetensors weights and config.json in {folder}")
        state: dict[str, torch.Tensor] = {}
        for path in files:
            state.update(load_file(str(path)))
        model = copy.deepcopy(self.base)
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
        if unexpected or set(missing) - tied:
            raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        self.loads += 1
        return Weights(model.eval(), f"full-{self.loads}")

    def _load_adapter(self, name: str, folder: Path) -> Weights:
        from peft import PeftModel

        if not (folder / "adapter_config.json").is_file():
            raise ValueError(f"No adapter found for {folder}")
        merged = PeftModel.from_pretrained(copy.deepcopy(self.base), str(folder)).merge_and_unload()
        return Weights(merged.eval(), name)

    async def _generate(
        self, prompt: list[int], sampling: dict[str, Any], pick: Callable[[], Weights]
    ) -> tuple[list[int], list[float], str]:
        """Sample token by token with whatever weights `pick` gives at each token."""
        max_tokens = int(sampling.get("max_tokens") or sampling.get("max_new_tokens") or 16)
        temperature = float(sampling.get("temperature", 1.0))
        top_p = float(sampling.get("top_p", 1.0))
        top_k = max(int(sampling.get("top_k", -1)), 0)
        seed = sampling.get("seed", sampling.get("sampling_seed"))
        gen = torch.Generator().manual_seed(int(seed) if seed is not None else uuid.uuid4().int % 2**31)
        ids: list[int] = []
        logprobs: list[float] = []
        tags: list[str] = []
        start = time.monotonic()
        finish = "length"
        for _ in range(max_tokens):
            weights = pick()
            with torch.no_grad():
                logits = weights.model(torch.tensor([prompt + ids])).logits[0, -1].float()
            sampled_from = processed_logprobs(logits[None], temperature, top_p, top_k)[0]
            if temperature == 0:
                token = int(torch.argmax(logits))
            else:
                token = int(torch.multinomial(sampled_from.exp(), 1, generator=gen))
            ids.append(token)
            logprobs.append(float(self.returned_logprobs(logits, sampled_from, temperature, top_p)[token]))
            tags.append(weights.tag)
            if token == self.tokenizer.eos_token_id:
                finish = "stop"
                break
            await asyncio.sleep(self.token_delay_s)  # let other calls (and syncs) run in between
        self.calls.append(CallRecord(start, time.monotonic(), tags))
        return ids, logprobs, finish

    async def _sync(self, path: str, apply: Callable[[], Any]) -> tuple[str, str]:
        """Run `apply` (load new weights, off the event loop) unless a failure is queued; record it.

        Returns ("ok", ""), ("refused", why) (the server's own refusal, weights unchanged) or
        ("error", why) (an internal error or a hang: HTTP 500).
        """
        start = time.monotonic()
        mode = await self._failure(path)
        outcome, why = "ok", ""
        if mode == "refuse":
            outcome, why = "refused", "the checkpoint does not match the served model (injected)"
        elif mode in ("error", "hang"):
            outcome, why = "error", f"injected {mode}"
        else:
            try:
                await asyncio.to_thread(apply)
            except Exception as exc:  # the server's own failure: it keeps its old weights
                outcome, why = "refused", str(exc)
        self.syncs.append(SyncRecord(path, start, time.monotonic(), outcome == "ok"))
        return outcome, why

    def app(self) -> Starlette:
        raise NotImplementedError("FakeVllm and FakeSglang define their routes")

    def returned_logprobs(
        self, logits: torch.Tensor, sampled_from: torch.Tensor, temperature: float, top_p: float
    ) -> torch.Tensor:
        """The logprobs [vocab] the server reports for a token sampled from `sampled_from`."""
        raise NotImplementedError("FakeVllm and FakeSglang say what their server returns")


class FakeVllm(FakeServer):
    """`vllm serve <model_dir> --served-model-name <served_model> --enable-lora` with
    VLLM_SERVER_DEV_MODE=1 and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True."""

    server_kind = "vllm"
    model_dir: Path = Path(".")
    logprobs_mode = "processed_logprobs"
    """vLLM's `--logprobs-mode` (what docs/gateway.md says to start it with); vLLM's own default is
    "raw_logprobs", the model's distribution before temperature and truncation."""

    def returned_logprobs(
        self, logits: torch.Tensor, sampled_from: torch.Tensor, temperature: float, top_p: float
    ) -> torch.Tensor:
        if self.logprobs_mode == "processed_logprobs":
            return sampled_from
        return torch.log_softmax(logits, dim=-1)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/collective_rpc", self.collective_rpc, methods=["POST"]),
                Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]),
                Route("/v1/load_lora_adapter", self.load_lora_adapter, methods=["POST"]),
                Route("/v1/unload_lora_adapter", self.unload_lora_adapter, methods=["POST"]),
            ]
        )

    @staticmethod
    def _error(status: int, message: str, kind: str) -> JSONResponse:
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
        return JSONResponse(body, status_code=status)

    async def models(self, request: Request) -> Response:
        data: list[dict[str, Any]] = [
            {
                "id": self.served_model,
                "object": "model",
                "owned_by": "vllm",
                "root": str(self.model_dir),
                "parent": None,
                "max_model_len": 2048,
                "permission": [],
            }
        ]
        data += [
            {
                "id": name,
                "object": "model",
                "owned_by": "vllm",
                "root": name,
                "parent": self.served_model,
                "max_model_len": None,
                "permission": [],
            }
            for name in self.adapters
        ]
        return JSONResponse({"object": "list", "data": data})

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append((request.url.path, body))
        name = body.get("model")
        if name != self.served_model and name not in self.adapters:
            return self._error(404, f"The model `{name}` does not exist.", "NotFoundError")
        if not body.get("return_token_ids") or body.get("stream"):
            return self._error(
                400, "the fake vLLM answers return_token_ids=true, stream=false only", "BadRequestError"
            )

        def pick() -> Weights:
            return self.weights if name == self.served_model else self.adapters[name]

        rendered = self.tokenizer.apply_chat_template(
            body["messages"], tools=body.get("tools"), add_generation_prompt=True, tokenize=True
        )
        prompt = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
        ids, logprobs, finish = await self._generate(prompt, body, pick)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        content: list[dict[str, Any]] = [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(ids, logprobs, strict=True)
        ]
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "tool_calls": []},
                        "logprobs": {"content": content},
                        "finish_reason": finish,
                        "stop_reason": None,
                        "token_ids": ids,
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(ids),
                    "total_tokens": len(prompt) + len(ids),
                },
                "prompt_logprobs": None,
                "prompt_token_ids": prompt,
            }
        )

    async def collective_rpc(self, request: Request) -> Response:
        body, refused = await self._body(request, "reload_weights")
        if refused is not None:
            return refused
        assert body is not None
        if body["method"] != "reload_weights":
            return self._error(
                500, f"AttributeError: 'Worker' has no attribute '{body['method']}'", "Internal Server Error"
            )

        def apply() -> None:
            self.weights = self._load_full(self.model_dir)

        outcome, why = await self._sync(request.url.path, apply)
        if outcome == "ok":
            return JSONResponse({"results": [None]})
        return self._error(500, f"RuntimeError: {why}", "Internal Server Error")

    async def reset_prefix_cache(self, request: Request) -> Response:
        self.requests.append((request.url.path, None))
        return Response(status_code=200)

    async def load_lora_adapter(self, request: Request) -> Response:
        body, refused = await self._body(request, "load_lora_adapter")
        if refused is not None:
            return refused
        assert body is not None
        name, path = body["lora_name"], Path(body["lora_path"])
        if name in self.adapters:
            return self._error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")

        def apply() -> None:
            self.adapters[name] = self._load_adapter(name, path)

        outcome, why = await self._sync(request.url.path, apply)
        if outcome == "ok":
            return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")
        if outcome == "error":
            return self._error(500, f"Loading lora {name} failed: {why}", "Internal Server Error")
        return self._error(400, f"Loading lora {name} failed: {why}", "BadRequestError")

    async def unload_lora_adapter(self, request: Request) -> Response:
        body, refused = await self._body(request, "unload_lora_adapter")
        if refused is not None:
            return refused
        assert body is not None
        name = body["lora_name"]
        if self.adapters.pop(name, None) is None:
            return self._error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


class FakeSglang(FakeServer):
    """`python -m sglang.launch_server --model-path <model> --enable-lora`."""

    server_kind = "sglang"
    return_original_logprob = False
    """SGLang's SGLANG_RETURN_ORIGINAL_LOGPROB: unset (its default and ours), the logprobs at the
    temperature renormalised over top-p (top-k left out); set, the raw model's."""

    def returned_logprobs(
        self, logits: torch.Tensor, sampled_from: torch.Tensor, temperature: float, top_p: float
    ) -> torch.Tensor:
        if self.return_original_logprob:
            return torch.log_softmax(logits, dim=-1)
        return sglang_logprobs(logits[None], temperature, top_p)[0]

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/get_model_info", self.get_model_info, methods=["GET"]),
                Route("/generate", self.generate, methods=["POST"]),
                Route("/update_weights_from_disk", self.update_weights_from_disk, methods=["POST"]),
                Route("/load_lora_adapter", self.load_lora_adapter, methods=["POST"]),
                Route("/unload_lora_adapter", self.unload_lora_adapter, methods=["POST"]),
                Route("/flush_cache", self.flush_cache, methods=["POST"]),
            ]
        )

    weight_version = "default"

    async def get_model_info(self, request: Request) -> Response:
        return JSONResponse(
            {
                "model_path": "fake",
                "tokenizer_path": "fake",
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
                "has_image_understanding": False,
                "has_audio_understanding": False,
            }
        )

    async def generate(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append((request.url.path, body))
        adapter = body.get("lora_path")
        if adapter is not None and adapter not in self.adapters:
            message = f"The following requested LoRA adapters are not loaded: {{'{adapter}'}}"
            error = {
                "object": "error",
                "message": message,
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
            return JSONResponse(error, status_code=400)

        def pick() -> Weights:
            return self.weights if adapter is None else self.adapters[adapter]

        prompt = body.get("input_ids") or list(self.tokenizer.encode(body["text"], add_special_tokens=False))
        ids, logprobs, finish = await self._generate(list(prompt), body.get("sampling_params", {}), pick)
        reason = (
            {"type": "stop", "matched": ids[-1]}
            if finish == "stop"
            else {"type": "length", "length": len(ids)}
        )
        return JSONResponse(
            {
                "text": self.tokenizer.decode(ids, skip_special_tokens=True),
                "output_ids": ids,
                "meta_info": {
                    "id": uuid.uuid4().hex,
                    "finish_reason": reason,
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(ids),
                    "cached_tokens": 0,
                    "weight_version": self.weight_version,
                    "output_token_logprobs": [[lp, t, None] for t, lp in zip(ids, logprobs, strict=True)],
                    "e2e_latency": 0.01,
                },
            }
        )

    @staticmethod
    def _update_answer(ok: bool, message: str) -> JSONResponse:
        body = {"success": ok, "message": message, "num_paused_requests": 0}
        return JSONResponse(body, status_code=200 if ok else 400)

    def _lora_answer(self, ok: bool, error_message: str | None) -> JSONResponse:
        body = {
            "success": ok,
            "error_message": error_message,
            "loaded_adapters": dict.fromkeys(self.adapters),
        }
        return JSONResponse(body, status_code=200 if ok else 400)

    async def update_weights_from_disk(self, request: Request) -> Response:
        body, refused = await self._body(request, "update_weights_from_disk")
        if refused is not None:
            return refused
        assert body is not None

        def apply() -> None:
            self.weights = self._load_full(Path(body["model_path"]))
            self.weight_version = str(body.get("weight_version") or self.weight_version)

        outcome, why = await self._sync(request.url.path, apply)
        if outcome == "ok":
            return self._update_answer(True, "Succeeded to update model weights.")
        if outcome == "error":
            return PlainTextResponse("Internal Server Error", status_code=500)
        return self._update_answer(
            False, f"Failed to get weights iterator: {why}. Rolled back to the original weights."
        )

    async def load_lora_adapter(self, request: Request) -> Response:
        body, refused = await self._body(request, "load_lora_adapter")
        if refused is not None:
            return refused
        assert body is not None
        name, path = body["lora_name"], Path(body["lora_path"])

        def apply() -> None:
            if name in self.adapters:
                raise ValueError(f"LoRA adapter {name} is already loaded")
            self.adapters[name] = self._load_adapter(name, path)

        outcome, why = await self._sync(request.url.path, apply)
        if outcome == "ok":
            return self._lora_answer(True, None)
        if outcome == "error":
            return PlainTextResponse("Internal Server Error", status_code=500)
        return self._lora_answer(False, f"Failed to load LoRA adapter {name}: {why}")

    async def unload_lora_adapter(self, request: Request) -> Response:
        body, refused = await self._body(request, "unload_lora_adapter")
        if refused is not None:
            return refused
        assert body is not None
        name = body["lora_name"]
        if self.adapters.pop(name, None) is None:
            return self._lora_answer(False, f"LoRA adapter {name} is not loaded")
        return self._lora_answer(True, None)

    async def flush_cache(self, request: Request) -> Response:
        return PlainTextResponse(self.formats["flush_cache"]["response"]["text"])
