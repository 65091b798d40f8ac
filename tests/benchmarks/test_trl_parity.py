"""benchmarks/trl_parity.py without TRL: its reinforge side against the published formulas, the
comparison it reports, and no RESULT line when TRL cannot be installed.

The TRL side itself needs the TRL venv (minutes to install), so it runs in the benchmark, not here.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def sides() -> tuple[dict[str, Any], dict[str, Any]]:
    parity = _load("trl_parity")
    fixtures = parity.load_fixtures()
    return fixtures, parity.reinforge_side(fixtures)


def test_the_reinforge_advantages_are_the_published_ones_at_trl_s_epsilon(
    sides: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    fixtures, ours = sides
    groups = [np.array(g) for g in fixtures["rewards"]]
    z = np.concatenate([(g - g.mean()) / (g.std(ddof=1) + 1e-4) for g in groups])
    assert ours["advantages"]["grpo"] == pytest.approx(z.tolist(), abs=1e-9)
    centred = np.concatenate([g - g.mean() for g in groups])
    assert ours["advantages"]["dr_grpo"] == pytest.approx(centred.tolist(), abs=1e-9)
    loo = np.concatenate([g - (g.sum() - g) / (len(g) - 1) for g in groups])
    assert ours["advantages"]["rloo"] == pytest.approx(loo.tolist(), abs=1e-9)


def test_the_reinforge_losses_are_the_published_ones_for_each_trl_loss_type(
    sides: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    fixtures, ours = sides
    parity = _load("trl_parity")
    mask, lp, old, behaviour = (np.array(fixtures[k]) for k in ("mask", "logprobs", "old", "behaviour"))
    a = np.array(fixtures["advantages"])[:, None]
    tis = np.minimum(np.exp(old - behaviour), parity.TIS_CAP)

    def per_token(eps_high: float) -> np.ndarray:
        rho = np.exp(lp - old)
        return -np.minimum(rho * a, np.clip(rho, 1 - parity.CLIP_EPS, 1 + eps_high) * a) * tis * mask

    plain, dapo = per_token(parity.CLIP_EPS), per_token(parity.DAPO_CLIP_HIGH)
    expected = {
        "grpo": np.mean(plain.sum(axis=1) / mask.sum(axis=1)),  # each sequence's token mean, then the mean
        "bnpo": plain.sum() / mask.sum(),  # one mean over every token
        "dr_grpo": plain.sum() / (mask.shape[0] * mask.shape[1]),  # / (rows x max_completion_length)
        "dapo": dapo.sum() / mask.sum(),  # token mean with clip-higher
    }
    for loss_type, value in expected.items():
        assert ours["losses"][loss_type]["loss"] == pytest.approx(float(value), abs=1e-9), loss_type
    # The fixtures tell the loss types apart, so a wrong mapping would show in the comparison.
    losses = sorted(v["loss"] for v in ours["losses"].values())
    assert min(b - a for a, b in itertools.pairwise(losses)) > 1e-3


def test_the_comparison_reports_the_largest_difference_per_case(
    sides: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, ours = sides
    parity = _load("trl_parity")
    assert max(parity.max_abs_diffs(ours, ours).values()) == 0.0
    theirs = {
        "advantages": {**ours["advantages"], "rloo": [x + 1e-5 for x in ours["advantages"]["rloo"]]},
        "losses": {
            **ours["losses"],
            "dapo": {**ours["losses"]["dapo"], "loss": ours["losses"]["dapo"]["loss"] - 0.5},
        },
    }
    diffs = parity.max_abs_diffs(ours, theirs)
    assert diffs["advantages/rloo"] == pytest.approx(1e-5)
    assert diffs["loss/dapo"] == pytest.approx(0.5)
    assert diffs["grad/dapo"] == 0.0
    theirs["advantages"]["grpo"] = theirs["advantages"]["grpo"][:-1]
    with pytest.raises(ValueError, match="advantages/grpo"):
        parity.max_abs_diffs(ours, theirs)


def test_without_trl_it_says_why_and_prints_no_result(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parity = _load("trl_parity")
    trl_venv = _load("_trl_venv")
    monkeypatch.setattr(trl_venv, "trl_python", lambda: "`pip install trl==1.16.0` failed: no network")
    monkeypatch.setattr(sys, "argv", ["trl_parity.py"])
    parity.main()
    out = capsys.readouterr().out
    assert "TRL could not be installed" in out and "no network" in out
    assert "RESULT" not in out
