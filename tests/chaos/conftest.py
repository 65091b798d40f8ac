"""Chaos tests kill real processes by PID (never by name) and check what survives."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
