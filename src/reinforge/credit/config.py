"""How spans become transitions and who gets credit: one validated config object."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CreditSource = Literal["equal", "discounted", "emitted", "air"]
CREDIT_SOURCES: tuple[CreditSource, ...] = ("equal", "discounted", "emitted", "air")


class AirPenalties(BaseModel):
    """Automatic Intermediate Rewards: how much each system signal costs the LLM call that caused it.

    Penalties are magnitudes (≥ 0) subtracted from that transition's reward, so `tool_error=0.2`
    turns a credit of 1.0 into 0.8.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_error: float = Field(default=0.2, ge=0.0, description="A tool span with error status.")
    malformed_tool_call: float = Field(
        default=0.2, ge=0.0, description="A tool call that could not be parsed."
    )
    timeout: float = Field(default=0.5, ge=0.0, description="The attempt ran out of time.")

    @model_validator(mode="before")
    @classmethod
    def _magnitudes(cls, data: Any) -> Any:
        # A negative number is the most likely mistake; say what to write instead of a bare "≥ 0".
        if isinstance(data, dict):
            for key, value in data.items():
                if isinstance(value, int | float) and value < 0:
                    raise ValueError(
                        f"AIR penalty {key}={value}: penalties are magnitudes subtracted from the reward; "
                        f"write {key}={-value}"
                    )
        return data


class CreditConfig(BaseModel):
    """Turning an attempt's spans into transitions and assigning credit to them.

    Attributes:
        mode: "per_call" makes one transition per LLM call (the paper's decomposition); "merged" joins
            consecutive calls whose prompt ids extend the previous prompt + response ids exactly into one
            sample (tokens in between masked out); calls that don't extend fall back to separate
            transitions and are counted as merge mismatches.
        agents: train only LLM calls made by these agent names (selective training); None trains all.
        assignment: credit sources, combinable ("equal+air" or ["equal", "air"]): "equal" gives the
            final reward to every transition; "discounted" gives gamma**k times it to the transition k
            steps from the end; "emitted" adds rewards emitted during the run to the LLM call before
            them; "air" subtracts `air` penalties from the call that caused a system signal.
        gamma: discount factor for "discounted" (only valid with it).
        air: penalties for "air" (only valid with it).
        include_failed: failed rollouts still give transitions (final reward as reported, 0.0 when
            none, plus AIR penalties) so that timeouts and crashes are learnt from; False skips them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["per_call", "merged"] = "per_call"
    agents: list[str] | None = None
    assignment: tuple[CreditSource, ...] = ("equal",)
    gamma: float = Field(default=0.9, gt=0.0, le=1.0)
    air: AirPenalties = Field(default_factory=AirPenalties)
    include_failed: bool = True

    @field_validator("assignment", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.replace(",", "+").split("+") if part.strip())
        return value

    @field_validator("agents")
    @classmethod
    def _agents(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("agents=[] would train nothing; use None to train every agent")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> CreditConfig:
        sources = self.assignment
        if not sources:
            raise ValueError("assignment needs at least one of equal, discounted, emitted, air")
        if len(set(sources)) != len(sources):
            raise ValueError(f"assignment lists a source twice: {list(sources)}")
        if "equal" in sources and "discounted" in sources:
            raise ValueError("equal and discounted both hand out the final reward; choose one")
        if set(sources) == {"air"}:
            raise ValueError("air only adds penalties; combine it with equal, discounted or emitted")
        if "gamma" in self.model_fields_set and "discounted" not in sources:
            raise ValueError("gamma is used only by discounted credit; add 'discounted' to assignment")
        if "air" in self.model_fields_set and "air" not in sources:
            raise ValueError("air penalties are used only by air credit; add 'air' to assignment")
        return self

    @property
    def gives_final_reward(self) -> bool:
        """Whether the final reward reaches transitions (through equal or discounted credit)."""
        return "equal" in self.assignment or "discounted" in self.assignment
