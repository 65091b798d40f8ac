from __future__ import annotations

import pytest
from pydantic import ValidationError

from reinforge.credit import AirPenalties, CreditConfig, CreditMetrics


def test_defaults_are_the_papers_decomposition() -> None:
    config = CreditConfig()
    assert config.mode == "per_call"
    assert config.assignment == ("equal",)
    assert config.agents is None
    assert config.gives_final_reward


def test_assignment_accepts_a_combined_string() -> None:
    assert CreditConfig(assignment="equal+air").assignment == ("equal", "air")
    assert CreditConfig(assignment="discounted, emitted", gamma=0.5).assignment == ("discounted", "emitted")
    assert CreditConfig(assignment=["emitted"]).gives_final_reward is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"assignment": "equal+discounted"}, "choose one"),
        ({"assignment": "air"}, "only adds penalties"),
        ({"assignment": ""}, "at least one"),
        ({"assignment": "equal+equal"}, "twice"),
        ({"assignment": "equal+bonus"}, "Input should be"),
        ({"gamma": 0.9}, "gamma is used only by discounted"),
        ({"air": {"tool_error": 0.1}}, "air penalties are used only by air"),
        ({"assignment": "discounted", "gamma": 0.0}, "greater than 0"),
        ({"agents": []}, "train nothing"),
        ({"mode": "joined"}, "per_call"),
        ({"lr": 1e-3}, "Extra inputs"),
    ],
)
def test_invalid_configs_are_refused_with_a_reason(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CreditConfig(**kwargs)  # type: ignore[arg-type]


def test_negative_penalty_says_what_to_write() -> None:
    with pytest.raises(ValidationError, match=r"write tool_error=0\.3"):
        AirPenalties(tool_error=-0.3)


def test_air_penalties_are_configurable_per_signal() -> None:
    config = CreditConfig(assignment="equal+air", air={"tool_error": 0.1, "timeout": 1.0})
    assert config.air == AirPenalties(tool_error=0.1, malformed_tool_call=0.2, timeout=1.0)


def test_metrics_add_and_report_shares() -> None:
    a = CreditMetrics(rollouts=1, calls=3, source_abs={"equal": 3.0}, air_signals={"tool_error": 1})
    b = CreditMetrics(rollouts=1, calls=2, merged_calls=1, merge_mismatches=1, source_abs={"air": 1.0})
    total = a + b
    assert total.rollouts == 2
    assert total.calls == 5
    assert total.air_signals == {"tool_error": 1}
    flat = total.as_dict()
    assert flat["credit/share_equal"] == pytest.approx(0.75)
    assert flat["credit/share_air"] == pytest.approx(0.25)
    assert flat["credit/share_emitted"] == 0.0
    assert flat["credit/merge_rate"] == pytest.approx(0.5)
    assert flat["credit/air_tool_error"] == 1.0
    assert flat["credit/calls"] == 5.0
