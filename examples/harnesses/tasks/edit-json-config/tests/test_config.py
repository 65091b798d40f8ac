import json
from pathlib import Path


def config() -> dict:
    return json.loads(Path("config.json").read_text())


def test_debug() -> None:
    assert config()["debug"] is True


def test_port() -> None:
    assert config()["port"] == 8080


def test_rest_kept() -> None:
    assert {k: config()[k] for k in ("name", "workers")} == {"name": "service", "workers": 4}
