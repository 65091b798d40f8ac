"""`gateway_http_client()`: the OpenAI SDK's async HTTP client on a `KeepAliveTransport`, for agents
that make many short LLM calls to the gateway."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from reinforge.net.keepalive_transport import KeepAliveTransport

_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


def gateway_http_client() -> Any:
    """The OpenAI SDK's async HTTP client with a `KeepAliveTransport`, one per event loop, shared.

        client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, http_client=gateway_http_client())

    Sharing one client also spares each rollout's `AsyncOpenAI` the SSL context a fresh httpx client
    builds. Needs the `openai` package; the SDK's defaults (timeouts, limits, redirects) are kept.
    """
    loop = asyncio.get_running_loop()
    client = _CLIENTS.get(loop)
    if client is None or client.is_closed:
        try:
            from openai import DefaultAsyncHttpxClient
        except ImportError as exc:  # pragma: no cover - openai is how agents reach the gateway
            raise ImportError("gateway_http_client() is for the OpenAI SDK: pip install openai") from exc
        # The SDK's client is httpx2's, whose transport base class is its own; ours serves both.
        client = DefaultAsyncHttpxClient(transport=KeepAliveTransport())  # type: ignore[arg-type]
        _CLIENTS[loop] = client
    return client
