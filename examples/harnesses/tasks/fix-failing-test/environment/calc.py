def add(a: int, b: int) -> int:
    """The sum of a and b."""
    return a - b


def mul(a: int, b: int) -> int:
    return a * b
