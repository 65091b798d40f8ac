"""The hand-written training step in docs/algorithms.md must keep running."""

from __future__ import annotations

import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"


def test_training_step_example_runs() -> None:
    text = DOC.read_text()
    section = text[text.index("### Functions for a training step") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    namespace: dict[str, object] = {}
    exec(compile(match.group(1), str(DOC), "exec"), namespace)
    loss = namespace["loss"]
    assert isinstance(loss, torch.Tensor) and torch.isfinite(loss)
    model = namespace["model"]
    assert isinstance(model, torch.nn.Module)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
