import os
import subprocess


def test_executable() -> None:
    assert os.access("run.sh", os.X_OK)


def test_prints_ok() -> None:
    assert subprocess.run(["./run.sh"], capture_output=True, text=True).stdout == "ok\n"
