from fizzbuzz import fizzbuzz


def test_numbers() -> None:
    assert fizzbuzz(1) == "1"
    assert fizzbuzz(7) == "7"


def test_fizz_buzz() -> None:
    assert fizzbuzz(9) == "Fizz"
    assert fizzbuzz(10) == "Buzz"


def test_fizzbuzz() -> None:
    assert fizzbuzz(30) == "FizzBuzz"
