"""How the run samples its calls: published once per phase, applied by the gateway to every call.

The trainer publishes one `RunSampling` per phase (training sampled, validation greedy or sampled)
in the attempt's resources under `SAMPLING_RESOURCE`. By default the run owns sampling: the gateway
replaces each call's temperature, top-p and top-k with the run's and caps its max_tokens at the
run's, whatever the agent asked, so an unchanged agent is sampled as the maths of the update
assumes. With `owner="agent"` the gateway honours what each call asks (the agent's own settings
then shape the behaviour policy only; truncated importance sampling corrects for them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import SamplingParams

SAMPLING_RESOURCE = "sampling"
"""The key of the attempt's resources that holds the run's `RunSampling`."""

SamplingOwner = Literal["run", "agent"]


class RunSampling(BaseModel):
    """One phase's sampling, as the trainer publishes it.

    Attributes:
        temperature: 0 is greedy (validation's greedy pass).
        top_p: nucleus truncation (1: none).
        top_k: top-k truncation (0: none).
        max_tokens: the most tokens one call may generate; an agent's own max_tokens is kept as a
            cap under it.
        owner: "run" (the gateway applies these to every call) or "agent" (each call is sampled as
            it asks).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    owner: SamplingOwner = "run"

    @classmethod
    def of_resources(cls, resources: Mapping[str, Any]) -> RunSampling | None:
        """The run's sampling in an attempt's resources; None when the run publishes none."""
        value = resources.get(SAMPLING_RESOURCE)
        if value is None:
            return None
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            raise InvalidRequestError(f"the attempt's resources hold no valid sampling: {exc}") from None

    def resource(self) -> dict[str, Any]:
        """The value published under `SAMPLING_RESOURCE` (what agents that read it see, too)."""
        return self.model_dump(exclude_none=True)

    def apply(self, asked: SamplingParams) -> SamplingParams:
        """The sampling a call gets when it asked for `asked`.

        Owned by the run: the run's temperature, top-p and top-k, and the smaller of the two
        max_tokens. Stops, seeds, penalties, bias and grammars stay the call's (they are part of what
        the agent does, and penalties, bias and grammars are behaviour-only). Owned by the agent:
        `asked` as it is.
        """
        if self.owner == "agent":
            return asked
        greedy = self.temperature == 0
        caps = [m for m in (asked.max_tokens, self.max_tokens) if m is not None]
        applied = {
            "temperature": self.temperature,
            "top_p": 1.0 if greedy else self.top_p,
            "top_k": 0 if greedy else self.top_k,
            "max_tokens": min(caps) if caps else None,
        }
        if all(getattr(asked, k) == v for k, v in applied.items()):
            return asked
        return asked.model_copy(update=applied)
