def last_n(items: list, n: int) -> list:
    """The last n items of items."""
    return items[len(items) - n - 1 :]
