"""The OpenAI-compatible gateway: per-attempt URLs, exact token ids and logprobs, recorded as spans.

app = create_gateway_app(store, backend, secret)      # serve it, or mount it beside the store
# agent side: base_url=<gateway>/r/<attempt_id>/v1, api_key=attempt_token(secret, attempt_id)
"""

from reinforge.gateway.app import create_gateway_app
from reinforge.gateway.recorder import SpanRecorder
from reinforge.gateway.routes import DEFAULT_MAX_BODY_BYTES
from reinforge.gateway.service import Gateway

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Gateway", "SpanRecorder", "create_gateway_app"]
