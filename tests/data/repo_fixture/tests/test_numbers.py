import pytest
from minitext import numbers


def test_clamp():
    assert numbers.clamp(5, 0, 10) == 5
    assert numbers.clamp(-3, 0, 10) == 0
    assert numbers.clamp(12, 0, 10) == 10
    assert numbers.clamp(0, 0, 0) == 0
    with pytest.raises(ValueError):
        numbers.clamp(1, 2, 1)


def test_mean():
    assert numbers.mean([1, 2, 3, 4]) == 2.5
    assert numbers.mean([7]) == 7
    with pytest.raises(ValueError):
        numbers.mean([])


def test_gcd():
    assert numbers.gcd(12, 18) == 6
    assert numbers.gcd(-4, 6) == 2
    assert numbers.gcd(7, 0) == 7
    assert numbers.gcd(17, 5) == 1


def test_digits():
    assert numbers.digits(0) == [0]
    assert numbers.digits(1234) == [1, 2, 3, 4]
    assert numbers.digits(10, base=2) == [1, 0, 1, 0]
    assert numbers.digits(255, 16) == [15, 15]


def test_accumulator():
    acc = numbers.Accumulator()
    acc.add(2)
    assert acc.add(3) == 5
