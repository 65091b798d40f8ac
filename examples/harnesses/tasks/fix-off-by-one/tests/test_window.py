from window import last_n


def test_last_two() -> None:
    assert last_n([1, 2, 3, 4], 2) == [3, 4]


def test_short_list() -> None:
    assert last_n([1], 3) == [1]


def test_zero() -> None:
    assert last_n([1, 2, 3], 0) == []
