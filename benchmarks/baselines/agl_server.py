"""Serve agentlightning 1.0.2's server (store + LLM proxy) on 127.0.0.1:<port>.

Run by the baseline's own venv: `.bench/agl-venv/bin/python benchmarks/baselines/agl_server.py PORT`.
It builds the app exactly as `python -m agentlightning.server` does (its `create_app` with the shipped
`server.yaml`), but, to give the baseline its best case, without uvicorn's access log and with
structlog filtered to warnings (by default it prints a line per proxied request).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import agentlightning
import structlog
import uvicorn
from agentlightning.server.app import create_app
from omegaconf import OmegaConf


def main() -> None:
    port = int(sys.argv[1])
    model_name = sys.argv[2] if len(sys.argv) > 2 else "policy"
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    config_path = Path(agentlightning.__file__).parent / "config" / "server.yaml"
    config = OmegaConf.load(config_path)
    config.host = "127.0.0.1"
    config.port = port
    config.key = ""
    config.default_proxy.model_name = model_name
    app = create_app(config)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        workers=1,
        timeout_keep_alive=120,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
