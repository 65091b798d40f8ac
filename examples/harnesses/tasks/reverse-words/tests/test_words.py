from words import reverse_words


def test_simple() -> None:
    assert reverse_words("one two three") == "three two one"


def test_spaces() -> None:
    assert reverse_words("a b  c") == "c b a"


def test_empty() -> None:
    assert reverse_words("") == ""
