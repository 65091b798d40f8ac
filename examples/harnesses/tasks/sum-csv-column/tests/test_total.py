from pathlib import Path


def test_total() -> None:
    assert Path("total.txt").read_text().strip() == "100"


def test_csv_untouched() -> None:
    assert Path("data.csv").read_text().count("\n") == 5
