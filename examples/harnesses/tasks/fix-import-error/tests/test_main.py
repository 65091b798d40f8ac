import subprocess
import sys


def test_runs() -> None:
    done = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Title Case Words\n"
