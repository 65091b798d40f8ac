"""Weight sync into a vLLM or SGLang server the user runs (docs/upstream.md has the server recipe).

Full weights go through disk: the trainer writes a safetensors folder both sides can read, then
- vLLM (`VLLM_SERVER_DEV_MODE=1`): `POST /collective_rpc {"method": "reload_weights"}` re-reads the
  folder the server was started from, and `POST /reset_prefix_cache` drops KV computed with the old
  weights;
- SGLang: `POST /update_weights_from_disk {"model_path", "weight_version"}` loads a folder per
  version (it flushes its radix cache itself) and answers `{"success", "message"}`.
LoRA adapters are hot-loaded under a versioned name, `policy-v<N>`: vLLM's
`POST /v1/load_lora_adapter {"lora_name", "lora_path"}` (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`,
`--enable-lora`), SGLang's `POST /load_lora_adapter` (`--enable-lora`); the backend asks for that
name from then on and the previous adapter is unloaded.

Every switch runs while the gateway holds calls (`RolloutStack.publish`), and the backend's version
changes only after the server said yes, so each answer comes from exactly one version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Literal

import httpx

from reinforge.inference.upstream import UpstreamBackend
from reinforge.net.keepalive_transport import KeepAliveTransport
from reinforge.stack.weight_sync.folders import remove_folder, write_adapter, write_full_weights
from reinforge.stack.weight_sync.protocol import ServedPolicy, StagedWeights, WeightSyncError

log = logging.getLogger(__name__)

SyncKind = Literal["full", "lora"]


ADAPTER_PREFIX = "policy-v"


def adapter_name(version: int) -> str:
    """The name a version's LoRA adapter is loaded under on the server (and its folder's name)."""
    return f"{ADAPTER_PREFIX}{version}"


def _server_message(response: httpx.Response) -> str:
    """The server's own explanation: vLLM's `{"error": {"message"}}` or `{"message"}`, SGLang's
    `{"message"}` / `{"error_message"}`, FastAPI's `{"detail"}`, or the text itself."""
    text = response.text.strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text[:2000] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "error_message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return text[:2000]


class _UpstreamSync(ABC):
    """What the vLLM and SGLang syncs share: the HTTP calls, staging, and the switch bookkeeping."""

    server = "upstream"

    def __init__(
        self,
        backend: UpstreamBackend,
        weights_dir: Path,
        model_config: Any,
        *,
        sync: SyncKind = "full",
        api_key: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.backend = backend
        self.weights_dir = Path(weights_dir).resolve()
        self.model_config = model_config
        self.sync: SyncKind = sync
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(
            base_url=backend.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            transport=KeepAliveTransport(),
        )
        self._serving: StagedWeights | None = None
        """The version the server serves from a folder of ours (None: the one it was started with)."""

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        """One control call; a transport failure, a timeout or an HTTP error is a WeightSyncError
        quoting the server."""
        url = self.backend.base_url + path
        try:
            response = await self._http.request(method, path, json=body)
        except httpx.TimeoutException:
            raise WeightSyncError(
                f"{self.server} {url} did not answer within {self.timeout_s:g}s "
                "(engine.sync_timeout_s); the server may still be loading"
            ) from None
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{self.server} {url} failed: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            raise WeightSyncError(
                f"{self.server} {url} answered {response.status_code}: {_server_message(response)}"
                + self._hint(path, response.status_code)
            )
        return response

    def _hint(self, path: str, status: int) -> str:
        """What to change on the server when a route is missing (its flags), appended to the error."""
        return ""

    @abstractmethod
    async def check(self) -> None: ...

    # -- staging (the old version still serves) ---------------------------------------------------

    def _folder(self, version: int) -> Path:
        return self.weights_dir / adapter_name(version)

    async def stage(self, policy: ServedPolicy, version: int) -> StagedWeights:
        """Write the version's weights (off the event loop: in-process agents keep running on it)."""
        if self.sync == "lora":
            if policy.lora is None or policy.roles:
                raise WeightSyncError("a LoRA sync needs a policy with one shared LoRA adapter (optim.lora)")
            folder = await asyncio.to_thread(write_adapter, self._folder(version), policy.model)
        else:
            state = policy.engine_state()
            folder = await asyncio.to_thread(
                write_full_weights, self._full_folder(version), state, self.model_config
            )
        return StagedWeights(version=version, folder=folder)

    def _full_folder(self, version: int) -> Path:
        return self._folder(version)

    # -- the switch (no call in flight) ------------------------------------------------------------

    async def switch(self, staged: StagedWeights) -> None:
        assert staged.folder is not None
        if self.sync == "lora":
            name = adapter_name(staged.version)
            await self._load_adapter(name, staged.folder)
            previous = self.backend.adapter
            self.backend.serve_version(staged.version, adapter=name)
            if previous is not None and previous != name:
                try:
                    await self._unload_adapter(previous)
                except WeightSyncError as exc:  # the switch is done; a stale adapter only costs memory
                    log.warning("could not unload the previous adapter %s: %s", previous, exc)
        else:
            await self._load_full(staged)
            self.backend.serve_version(staged.version)
        old, self._serving = self._serving, staged
        if old is not None and old.folder != staged.folder:
            remove_folder(old.folder)

    @abstractmethod
    async def _load_full(self, staged: StagedWeights) -> None: ...

    @abstractmethod
    async def _load_adapter(self, name: str, folder: Path) -> None: ...

    @abstractmethod
    async def _unload_adapter(self, name: str) -> None: ...


class VllmWeightSync(_UpstreamSync):
    """Sync into a `vllm serve` server (see the module docstring for its flags)."""

    server = "vLLM"

    def _full_folder(self, version: int) -> Path:
        return self.weights_dir  # reload_weights re-reads the folder the server was started from

    def _hint(self, path: str, status: int) -> str:
        if status == 404 and path in ("/collective_rpc", "/reset_prefix_cache"):
            return " (start vLLM with VLLM_SERVER_DEV_MODE=1 for its weight-reload routes)"
        if status == 404 and path.endswith("_lora_adapter"):
            return " (start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora)"
        return ""

    async def check(self) -> None:
        """The server answers, serves `engine.served_model`, and (full sync) was started on the folder."""
        body = (await self._call("GET", "/v1/models")).json()
        served = [m.get("id") for m in body.get("data", [])]
        if self.backend.model_name not in served:
            raise WeightSyncError(
                f"the vLLM server at {self.backend.base_url} serves {served}, not "
                f"{self.backend.model_name!r} (engine.served_model; vLLM's --served-model-name)"
            )
        if self.sync == "full" and not (self.weights_dir / "config.json").is_file():
            raise WeightSyncError(
                f"engine.weights_dir {self.weights_dir} has no config.json: vLLM's full sync reloads the "
                "folder the server was started from, so start `vllm serve` on that folder"
            )
        # Adapters an earlier session left loaded: a resumed run loads its version's name again.
        for model in body.get("data", []):
            name = str(model.get("id"))
            if model.get("parent") == self.backend.model_name and name.startswith(ADAPTER_PREFIX):
                await self._unload_adapter(name)

    async def _load_full(self, staged: StagedWeights) -> None:
        body = await self._call("POST", "/collective_rpc", {"method": "reload_weights"})
        if body.content:
            results = body.json().get("results")
            if results is not None and not isinstance(results, list):
                raise WeightSyncError(f"vLLM's reload_weights answered {results!r}")
        # Prefix caching would otherwise reuse KV computed with the previous weights.
        await self._call("POST", "/reset_prefix_cache")

    async def _load_adapter(self, name: str, folder: Path) -> None:
        await self._call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})

    async def _unload_adapter(self, name: str) -> None:
        await self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name})


class SglangWeightSync(_UpstreamSync):
    """Sync into an SGLang server (`python -m sglang.launch_server`; see the module docstring)."""

    server = "SGLang"

    async def check(self) -> None:
        info = (await self._call("GET", "/get_model_info")).json()
        if info.get("is_generation") is False:
            raise WeightSyncError(f"the SGLang server at {self.backend.base_url} serves no generation model")

    def _succeeded(self, response: httpx.Response, what: str) -> None:
        body = response.json()
        if not body.get("success", False):
            raise WeightSyncError(f"SGLang refused {what}: {_server_message(response)}")

    async def _load_full(self, staged: StagedWeights) -> None:
        response = await self._call(
            "POST",
            "/update_weights_from_disk",
            {"model_path": str(staged.folder), "weight_version": str(staged.version)},
        )
        self._succeeded(response, f"the weights in {staged.folder}")

    async def _load_adapter(self, name: str, folder: Path) -> None:
        # SGLang has no route listing its adapters to clean up at start, and an earlier run on the
        # same server may have left this name loaded (its load would be refused): unload it first
        # (refused, harmlessly, when it isn't there).
        with contextlib.suppress(WeightSyncError):
            await self._unload_adapter(name)
        body = {"lora_name": name, "lora_path": str(folder)}
        self._succeeded(await self._call("POST", "/load_lora_adapter", body), f"the adapter {name}")

    async def _unload_adapter(self, name: str) -> None:
        response = await self._call("POST", "/unload_lora_adapter", {"lora_name": name})
        self._succeeded(response, f"unloading {name}")
