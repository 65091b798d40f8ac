import subprocess
import sys


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, "greet.py", *args], capture_output=True, text=True, check=True)
    return done.stdout


def test_plain() -> None:
    assert run("--name", "Ada") == "Hello, Ada!\n"


def test_shout() -> None:
    assert run("--name", "Ada", "--shout") == "HELLO, ADA!\n"


def test_shout_default_name() -> None:
    assert run("--shout") == "HELLO, WORLD!\n"
