import subprocess
import sys

from calc import add, mul


def test_add() -> None:
    assert add(2, 3) == 5
    assert add(-4, 4) == 0


def test_mul_untouched() -> None:
    assert mul(3, 4) == 12


def test_visible_test_passes() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"])
    assert done.returncode == 0
