"""Number helpers."""


def clamp(x, lo, hi):
    """`x` limited to the range [lo, hi]."""
    if lo > hi:
        raise ValueError("lo > hi")
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(values):
    """The arithmetic mean of `values`; ValueError when there are none."""
    if not values:
        raise ValueError("mean of no values")
    return sum(values) / len(values)


def gcd(a, b):
    """The greatest common divisor of two integers (non-negative)."""
    a, b = abs(a), abs(b)
    while b:
        a, b = b, a % b
    return a


def digits(n, base=10):
    """The digits of a non-negative integer in `base`, most significant first."""
    if n == 0:
        return [0]
    out = []
    while n > 0:
        out.append(n % base)
        n //= base
    return out[::-1]


class Accumulator:
    """A running total (a class: its methods get no recorded-call tests)."""

    def __init__(self):
        self.total = 0

    def add(self, x):
        self.total += x
        return self.total
