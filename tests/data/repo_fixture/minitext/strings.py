"""String helpers."""

import re

VOWELS = "aeiou"


def slugify(text, sep="-"):
    """Lower-case words of `text` joined by `sep`; anything but letters and digits separates."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return sep.join(words)


def count_vowels(text):
    """How many vowels (a, e, i, o, u, either case) `text` holds."""
    n = 0
    for ch in text.lower():
        if ch in VOWELS:
            n += 1
    return n


def truncate(text, width, suffix="..."):
    """`text` cut to at most `width` characters, ending with `suffix` when it was cut."""
    if width < len(suffix):
        raise ValueError("width is shorter than the suffix")
    if len(text) <= width:
        return text
    return text[: width - len(suffix)] + suffix


def is_palindrome(text):
    """Whether `text` reads the same backwards, ignoring case and anything but letters."""
    letters = [c for c in text.lower() if c.isalpha()]
    return letters == letters[::-1]


def initials(name):
    """The upper-case initials of a name ("ada lovelace" -> "AL"); not called by the tests."""
    return "".join(part[0].upper() for part in name.split())
