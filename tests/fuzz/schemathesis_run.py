"""Runs the schemathesis CLI against a served OpenAPI document and reads its JSON report.

Why the CLI rather than `@schema.parametrize()`: one run covers every operation with positive and
negative cases, the coverage phase's boundary values and the stateful phase (the links schemathesis
infers between operations), with every check, exactly as a user would run it against a deployment.
The seed and `max_examples` are fixed, so CI runs the same cases every time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SEED = 20261202


@dataclass(frozen=True)
class FuzzReport:
    exit_code: int
    generated: int
    operations_tested: int
    operations_total: int
    failures: list[dict[str, object]]
    errors: list[dict[str, object]]
    phases: dict[str, str]
    output: str

    def explain(self) -> str:
        """The CLI's own account of what failed (request, response, how to reproduce)."""
        return self.output[-20000:]


def run_schemathesis(
    schema_url: str,
    report_dir: Path,
    *,
    max_examples: int,
    headers: dict[str, str],
    exclude_path_regex: str | None = None,
    include_path_regex: str | None = None,
    exclude_checks: str | None = None,
    phases: str = "examples,coverage,fuzzing,stateful",
    base_url: str | None = None,
    timeout_s: float = 300,
) -> FuzzReport:
    """`st run` with all checks (but `exclude_checks`), positive and negative cases, every phase (or
    `phases`); the parsed JSON report. `schema_url` may be a file, served at `base_url`."""
    report = report_dir / "schemathesis.json"
    cmd = [
        str(Path(sys.executable).with_name("st")),
        "run",
        schema_url,
        "--checks", "all",
        "--mode", "all",
        "--phases", phases,
        "--max-examples", str(max_examples),
        "--seed", str(SEED),
        "--workers", "1",
        "--request-timeout", "30",
        "--continue-on-failure",
        "--no-shrink",
        "--report", "json",
        "--report-json-path", str(report),
    ]  # fmt: skip
    if exclude_path_regex is not None:
        cmd += ["--exclude-path-regex", exclude_path_regex]
    if include_path_regex is not None:
        cmd += ["--include-path-regex", include_path_regex]
    if exclude_checks is not None:
        cmd += ["--exclude-checks", exclude_checks]
    if base_url is not None:
        cmd += ["--url", base_url]
    for name, value in headers.items():
        cmd += ["--header", f"{name}: {value}"]
    env = {**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_TELEMETRY": "false"}
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=report_dir, check=False
    )
    output = done.stdout + done.stderr
    if not report.exists():
        raise AssertionError(f"schemathesis wrote no report (exit {done.returncode}):\n{output[-5000:]}")
    data = json.loads(report.read_text())
    return FuzzReport(
        exit_code=done.returncode,
        generated=data["test_cases"]["generated"],
        operations_tested=data["operations"]["tested"],
        operations_total=data["operations"]["total"],
        failures=data["failures"],
        errors=data["errors"],
        phases={name: phase["status"] for name, phase in data["phases"].items()},
        output=output,
    )
