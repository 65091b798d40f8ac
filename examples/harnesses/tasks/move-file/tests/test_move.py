from pathlib import Path


def test_moved() -> None:
    assert not Path("notes.md").exists()
    assert Path("docs/notes.md").read_text() == "# Notes\n\nRemember the milk.\n"
