"""reinforge.credit: an attempt's spans → training transitions, with credit assigned.

transitions, metrics = build_transitions(rollout, spans, CreditConfig(mode="merged",
                                         assignment="equal+air"), attempts=attempts)
"""

from reinforge.credit.build import build_transitions
from reinforge.credit.config import CREDIT_SOURCES, AirPenalties, CreditConfig, CreditSource
from reinforge.credit.metrics import CreditMetrics

__all__ = [
    "CREDIT_SOURCES",
    "AirPenalties",
    "CreditConfig",
    "CreditMetrics",
    "CreditSource",
    "build_transitions",
]
