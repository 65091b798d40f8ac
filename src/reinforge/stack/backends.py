"""`EngineSettings` -> the `Backend` the gateway asks, the engine behind it (embedded only) and the
`WeightSync` that moves it to each new policy version: once, for the trainer, the SFT recording and
`reinforge store serve` alike.

torch, transformers and the engine are imported only when an embedded engine is built, so serving a
scripted, upstream or model-less gateway starts without them.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import Backend
from reinforge.inference.no_model import NoModelBackend
from reinforge.stack.settings import EngineSettings

if TYPE_CHECKING:
    from reinforge.engine.engine import Engine
    from reinforge.engine.process import EngineProcess
    from reinforge.stack.weight_sync import WeightSync

NO_MODEL_HINT = (
    "this store server serves no model: start `reinforge store serve` with --model-dir DIR, "
    "--upstream URL --upstream-model NAME, or --scripted FILE"
)


@dataclass
class Serving:
    """A built backend and what it needs started, synced and closed."""

    backend: Backend
    engine: Engine | EngineProcess | None = None
    """The embedded engine (None for the other backends)."""
    weight_sync: WeightSync | None = None
    """How a trainer publishes new weights (None: this backend can't take them, e.g. scripted)."""

    async def start(self) -> None:
        """Check the weight sync (fails early, saying what to fix) and start the engine."""
        if self.weight_sync is not None:
            await self.weight_sync.check()
        if self.engine is not None:
            await asyncio.to_thread(self.engine.start)

    async def aclose(self) -> None:
        if self.engine is not None:
            await asyncio.to_thread(self.engine.stop)
        if self.weight_sync is not None:
            await self.weight_sync.aclose()
        aclose = getattr(self.backend, "aclose", None)
        if aclose is not None:
            await aclose()


def load_pretrained(model_dir: str | Path) -> tuple[Any, Any]:
    """The model and tokenizer in a Hugging Face model folder, ready to serve.

    The one place a model named in settings becomes weights (`EngineSettings.model_dir`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinforge.models import resolve_model

    source = resolve_model(model_dir)  # a folder, a packaged model's cached folder, or a hub id
    if Path(source).is_dir() and not (Path(source) / "config.json").is_file():
        raise InvalidRequestError(f"--model-dir {source} has no config.json (a model folder)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source)
    except OSError as exc:
        raise InvalidRequestError(f"cannot load the model {source!r}: {exc}") from exc
    model.eval()
    return model, tokenizer


def build_serving(
    settings: EngineSettings,
    model: Any = None,
    tokenizer: Any = None,
    *,
    policy_version: int = 0,
    seed: int | None = None,
) -> Serving:
    """The backend `settings` name, serving `model` (the embedded engine's: give it a copy nobody
    updates in place) or, without one, the model in `settings.model_dir`. With an upstream server
    only the model's config is read (for its weights folder), and `tokenizer` renders prompts."""
    if settings.backend == "embedded":
        if model is None:
            if settings.model_dir is None:
                raise InvalidRequestError(
                    "the embedded engine needs a model: give engine.model_dir (--model-dir)"
                )
            model, tokenizer = load_pretrained(settings.model_dir)
        return _embedded(settings, model, tokenizer, policy_version, seed)
    if settings.upstream:
        return _upstream(settings, model, tokenizer, policy_version)
    if settings.backend == "scripted":
        assert settings.scripted is not None  # EngineSettings checks
        return Serving(scripted_backend(settings.scripted, settings.model_name))
    return Serving(NoModelBackend(settings.model_name, NO_MODEL_HINT))


def _embedded(
    settings: EngineSettings, model: Any, tokenizer: Any, policy_version: int, seed: int | None
) -> Serving:
    from reinforge.engine.engine import Engine
    from reinforge.engine.engine_backend import EngineBackend
    from reinforge.engine.process import EngineProcess, EngineRestartPolicy
    from reinforge.stack.weight_sync import EmbeddedEngineSync

    limits: dict[str, Any] = {
        "max_batch_size": settings.max_batch_size,
        "max_seq_len": settings.max_seq_len,
        "retain_prefixes": settings.retain_prefixes,
        "speculative_ngram": settings.speculative_ngram,
        "policy_version": policy_version,
        "seed": seed,
    }
    engine: Engine | EngineProcess
    if settings.process:  # a dead engine child is replaced, serving the last published weights
        engine = EngineProcess(model, tokenizer, restarts=EngineRestartPolicy(), **limits)
    else:
        engine = Engine(model, tokenizer, **limits)
    backend = EngineBackend(engine, tokenizer, model_name=settings.model_name)
    return Serving(backend, engine, EmbeddedEngineSync(engine))


def _upstream(settings: EngineSettings, model: Any, tokenizer: Any, policy_version: int) -> Serving:
    from reinforge.inference.upstream import UpstreamBackend, api_key_from_env

    assert settings.url is not None and settings.backend in ("vllm", "sglang")  # EngineSettings checks
    api_key = settings.api_key.get_secret_value() if settings.api_key is not None else api_key_from_env()
    backend = UpstreamBackend(
        settings.url,
        settings.served_model,
        api_key,
        flavor=settings.backend,
        tokenizer=tokenizer,
        policy_version=policy_version,
    )
    if settings.weights_dir is None or model is None:  # served as it is: nothing publishes to it
        return Serving(backend)
    from reinforge.stack.weight_sync import SglangWeightSync, VllmWeightSync

    sync_type = VllmWeightSync if settings.backend == "vllm" else SglangWeightSync
    sync = sync_type(
        backend,
        settings.weights_dir,
        model.config,
        sync=settings.sync,
        api_key=api_key,
        timeout_s=settings.sync_timeout_s,
    )
    return Serving(backend, weight_sync=sync)


def scripted_backend(path: Path, model_name: str) -> Backend:
    """Replies read from a JSON list (strings, or `{"text", "tool_calls"}`), answered in turn, with a
    tokenizer built from them: wiring tests of agents need no model."""
    from reinforge.inference.scripted import ScriptedBackend, ScriptedReply
    from reinforge.models import build_tokenizer

    try:
        replies = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InvalidRequestError(f"--scripted {path}: {e}") from e
    if not isinstance(replies, list) or not replies:
        raise InvalidRequestError(f"--scripted {path}: expected a non-empty JSON list of replies")
    try:
        parsed = [
            ScriptedReply(text=r) if isinstance(r, str) else ScriptedReply.model_validate(r) for r in replies
        ]
    except ValueError as e:
        raise InvalidRequestError(f"--scripted {path}: {e}") from e
    corpus = [json.dumps(r.model_dump()) for r in parsed] * 4
    tokenizer = build_tokenizer(corpus, vocab_size=400)
    return ScriptedBackend(tokenizer, parsed, model_name=model_name)
