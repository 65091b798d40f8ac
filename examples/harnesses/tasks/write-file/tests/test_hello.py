from pathlib import Path


def test_exists() -> None:
    assert Path("hello.txt").is_file()


def test_content() -> None:
    assert Path("hello.txt").read_text() == "Hello, reinforge!\n"
