import subprocess
import sys
from pathlib import Path


def count(path: str) -> str:
    done = subprocess.run([sys.executable, "count.py", path], capture_output=True, text=True, check=True)
    return done.stdout


def test_sample() -> None:
    assert count("sample.txt") == "3\n"


def test_other(tmp_path: Path) -> None:
    other = tmp_path / "five.txt"
    other.write_text("a\nb\nc\nd\ne\n")
    assert count(str(other)) == "5\n"
