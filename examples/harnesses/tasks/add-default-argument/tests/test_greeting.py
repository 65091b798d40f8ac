from greeting import greeting


def test_default() -> None:
    assert greeting() == "Hello, world!"


def test_named() -> None:
    assert greeting("Ada") == "Hello, Ada!"
