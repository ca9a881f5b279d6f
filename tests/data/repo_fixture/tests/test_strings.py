import pytest
from minitext.strings import count_vowels, is_palindrome, slugify, truncate


def test_slugify():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  Many   spaces here ") == "many-spaces-here"
    assert slugify("Snake case", sep="_") == "snake_case"
    assert slugify("") == ""


def test_count_vowels():
    assert count_vowels("Programming") == 3
    assert count_vowels("AEIOU xyz") == 5
    assert count_vowels("") == 0


def test_truncate():
    assert truncate("hello world", 8) == "hello..."
    assert truncate("short", 10) == "short"
    assert truncate("exactly10!", 10) == "exactly10!"
    assert truncate("abcdef", 4, suffix="~") == "abc~"
    with pytest.raises(ValueError):
        truncate("abc", 1)


def test_is_palindrome():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert not is_palindrome("palindrome")
    assert is_palindrome("")
