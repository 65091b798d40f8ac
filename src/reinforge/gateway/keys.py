"""The keys of the gateway's callers: an attempt's own (its agent's API key) and the runner's finish key."""

from __future__ import annotations

from reinforge.access import attempt_token, finish_token, token_matches
from reinforge.gateway.errors import GatewayHTTPError

_MAX_CACHED_TOKENS = 65_536


class AttemptKeys:
    """Checks the keys a request carries against the ones derived from the gateway's secret."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the gateway secret must not be empty")
        self._secret = secret
        self._tokens: dict[str, str] = {}

    def token_for(self, attempt_id: str) -> str:
        """The attempt's token, remembered: an HMAC per call would cost more than the rest of a check."""
        token = self._tokens.get(attempt_id)
        if token is None:
            if len(self._tokens) >= _MAX_CACHED_TOKENS:
                self._tokens.clear()
            token = self._tokens[attempt_id] = attempt_token(self._secret, attempt_id)
        return token

    def check_attempt(self, attempt_id: str, given: str | None) -> None:
        """The attempt's own token (the agent's API key) or a 401."""
        if given is None:
            raise GatewayHTTPError(
                401, "missing bearer token: send the attempt's token as the API key", code="missing_api_key"
            )
        if not token_matches(self.token_for(attempt_id), given):
            raise GatewayHTTPError(
                401, f"the token is not valid for attempt {attempt_id!r}", code="invalid_api_key"
            )

    def check_finish(self, attempt_id: str, given: str | None) -> None:
        """Finishing needs the runner's token for the attempt; the agent's own token is refused."""
        if not token_matches(finish_token(self._secret, attempt_id), given):
            raise GatewayHTTPError(
                401,
                f"finishing attempt {attempt_id!r} needs the runner's finish token "
                "(reinforge.access.finish_token); the attempt's API key can't end it",
                code="invalid_api_key",
            )
