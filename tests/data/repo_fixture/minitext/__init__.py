"""minitext: small text, number and list helpers."""

from .lists import chunk, dedupe, flatten, rotate
from .numbers import clamp, digits, gcd, mean
from .strings import count_vowels, is_palindrome, slugify, truncate

__all__ = ["chunk", "clamp", "count_vowels", "dedupe", "digits", "flatten", "gcd",
           "is_palindrome", "mean", "rotate", "slugify", "truncate"]
