"""What credit assignment did to a batch: where the credit came from and how merging went."""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict, Field

from reinforge.credit.config import CREDIT_SOURCES


class CreditMetrics(BaseModel):
    """Counters for one rollout; add them (`a + b`) to get a batch's, then log `as_dict()`.

    `source_abs` holds the summed absolute credit per source, so shares are comparable across sources
    of opposite sign (AIR penalties are negative, rewards mostly positive).
    """

    model_config = ConfigDict(extra="forbid")

    rollouts: int = 0
    rollouts_without_calls: int = 0
    calls: int = Field(default=0, description="LLM calls found in the final attempt.")
    calls_trained: int = Field(default=0, description="Calls kept after the agent filter.")
    calls_filtered: int = Field(default=0, description="Calls of agents not being trained.")
    calls_skipped: int = Field(default=0, description="Calls without usable token ids or logprobs.")
    calls_named_by_role: int = Field(
        default=0, description="Calls given their framework role's name (no explicit agent name)."
    )
    calls_role_ambiguous: int = Field(
        default=0, description="Calls inside overlapping roles of different names, left unnamed."
    )
    transitions: int = 0
    merged_calls: int = Field(default=0, description="Calls joined onto the previous call's sample.")
    merge_mismatches: int = Field(default=0, description="Calls whose prompt did not extend the last one.")
    merged_transitions: int = Field(default=0, description="Transitions made of two or more calls.")
    merge_mismatch_reasons: dict[str, int] = Field(
        default_factory=dict,
        description="Why calls did not extend the last one (credit.merge.MISMATCH_REASONS) → count.",
    )
    history_respelled: int = Field(
        default=0, description="History turns the agent sent back respelled, rendered as generated."
    )
    history_unmatched: int = Field(
        default=0, description="History turns the gateway did not produce (or that changed): as sent."
    )
    trained_tokens: int = 0
    masked_tokens: int = Field(default=0, description="Tool results/observations inside merged samples.")
    prompt_tokens: int = 0
    source_abs: dict[str, float] = Field(default_factory=dict)
    air_signals: dict[str, int] = Field(default_factory=dict)
    credit_dropped: int = Field(default=0, description="Emitted rewards/signals on calls not trained.")
    missing_final_reward: int = 0

    def __add__(self, other: CreditMetrics) -> CreditMetrics:
        counts = {
            name: getattr(self, name) + getattr(other, name)
            for name, field in CreditMetrics.model_fields.items()
            if field.annotation is int
        }
        return CreditMetrics(
            **counts,
            source_abs=dict(Counter(self.source_abs) + Counter(other.source_abs)),
            air_signals=dict(Counter(self.air_signals) + Counter(other.air_signals)),
            merge_mismatch_reasons=dict(
                Counter(self.merge_mismatch_reasons) + Counter(other.merge_mismatch_reasons)
            ),
        )

    def source_share(self) -> dict[str, float]:
        """Each source's fraction of all absolute credit handed out (0.0 for sources unused)."""
        total = sum(self.source_abs.values())
        return {s: (self.source_abs.get(s, 0.0) / total if total > 0 else 0.0) for s in CREDIT_SOURCES}

    def as_dict(self, prefix: str = "credit/") -> dict[str, float]:
        """Flat numbers for a metrics log."""
        out: dict[str, float] = {
            f"{prefix}{name}": float(getattr(self, name))
            for name, field in CreditMetrics.model_fields.items()
            if field.annotation is int
        }
        for source, share in self.source_share().items():
            out[f"{prefix}share_{source}"] = share
        for signal, count in sorted(self.air_signals.items()):
            out[f"{prefix}air_{signal}"] = float(count)
        for reason, count in sorted(self.merge_mismatch_reasons.items()):
            out[f"{prefix}merge_mismatch/{reason}"] = float(count)
        attempted = self.merged_calls + self.merge_mismatches
        out[f"{prefix}merge_rate"] = self.merged_calls / attempted if attempted else 0.0
        return out
