"""Write two small files in MBPP's published layout (`google-research-datasets/mbpp`, config
`full`: task_id, text, code, test_list, test_setup_code, challenge_test_list), exported with
`datasets` as `Dataset.to_json` exports the real splits: mbpp-train.jsonl (10 records) and
mbpp-test.jsonl (6). The problems are our own, MBPP-like; the train file plants one exact
duplicate of a test problem (task 1010) and one near-duplicate (task 1011), so that
`mlx-rlaif data overlap` and `data.decontaminate_against` have something to find.

This lets docs/data.md's "Training on MBPP" path run without network:

    python tools/mbpp_fixture.py --out /tmp/mbpp

Not covered: anything of MBPP itself (get the real files with `datasets`, see docs/data.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def rec(task_id: int, text: str, code: str, tests: list[str]) -> dict:
    return {"task_id": task_id, "text": text, "code": code.replace("\n", "\r\n"),
            "test_list": tests, "test_setup_code": "", "challenge_test_list": []}


TEST = [
    rec(2001, "Write a function to find the maximum of three numbers.",
        "def max_of_three(a, b, c):\n    return max(a, b, c)\n",
        ["assert max_of_three(1, 2, 3) == 3", "assert max_of_three(-1, -5, -3) == -1",
         "assert max_of_three(7, 7, 2) == 7"]),
    rec(2002, "Write a python function to check whether a given number is even or not.",
        "def is_even(n):\n    return n % 2 == 0\n",
        ["assert is_even(4) == True", "assert is_even(7) == False", "assert is_even(0) == True"]),
    rec(2003, "Write a function to reverse the words in a given sentence, keeping each word "
        "intact.",
        "def reverse_words(s):\n    return ' '.join(s.split()[::-1])\n",
        ["assert reverse_words('hello world') == 'world hello'",
         "assert reverse_words('a b c') == 'c b a'", "assert reverse_words('one') == 'one'"]),
    rec(2004, "Write a function to count the number of vowels in a string.",
        "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
        ["assert count_vowels('banana') == 3", "assert count_vowels('xyz') == 0",
         "assert count_vowels('AEIOU') == 5"]),
    rec(2005, "Write a function to return the square of a number.",
        "def square(x):\n    return x * x\n",
        ["assert square(3) == 9", "assert square(-4) == 16", "assert square(0) == 0"]),
    rec(2006, "Write a function that removes duplicate items from a list while keeping the "
        "order of their first appearance.",
        "def dedupe(xs):\n    seen = set()\n    out = []\n    for x in xs:\n"
        "        if x not in seen:\n            seen.add(x)\n            out.append(x)\n"
        "    return out\n",
        ["assert dedupe([1, 2, 1, 3, 2]) == [1, 2, 3]", "assert dedupe([]) == []",
         "assert dedupe(['a', 'a']) == ['a']"]),
]

TRAIN = [
    rec(1001, "Write a function to add two numbers.", "def add(a, b):\n    return a + b\n",
        ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]),
    rec(1002, "Write a function to find the minimum of a list of numbers.",
        "def min_of_list(xs):\n    return min(xs)\n",
        ["assert min_of_list([3, 1, 2]) == 1", "assert min_of_list([5]) == 5",
         "assert min_of_list([-2, -7]) == -7"]),
    rec(1003, "Write a function to return the last element of a list.",
        "def last(xs):\n    return xs[-1]\n",
        ["assert last([1, 2, 3]) == 3", "assert last(['x']) == 'x'", "assert last([0, 9]) == 9"]),
    rec(1004, "Write a function to double every number of a list.",
        "def double_all(xs):\n    return [2 * x for x in xs]\n",
        ["assert double_all([1, 2]) == [2, 4]", "assert double_all([]) == []",
         "assert double_all([-3]) == [-6]"]),
    rec(1005, "Write a function to return the length of a string.",
        "def str_len(s):\n    return len(s)\n",
        ["assert str_len('abc') == 3", "assert str_len('') == 0", "assert str_len('  ') == 2"]),
    rec(1006, "Write a function to check whether a number is positive.",
        "def is_positive(n):\n    return n > 0\n",
        ["assert is_positive(3) == True", "assert is_positive(0) == False",
         "assert is_positive(-2) == False"]),
    rec(1007, "Write a function to convert a string to upper case.",
        "def to_upper(s):\n    return s.upper()\n",
        ["assert to_upper('abc') == 'ABC'", "assert to_upper('A1b') == 'A1B'",
         "assert to_upper('') == ''"]),
    rec(1008, "Write a function to sum the digits of a non-negative integer.",
        "def digit_sum(n):\n    return sum(int(d) for d in str(n))\n",
        ["assert digit_sum(123) == 6", "assert digit_sum(0) == 0", "assert digit_sum(99) == 18"]),
    # planted: an exact duplicate of test task 2003 (another id) ...
    rec(1010, TEST[2]["text"], "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
        TEST[2]["test_list"]),
    # ... and a near-duplicate of test task 2006 (a few words changed)
    rec(1011, "Write a function which removes the duplicate items from a list while keeping "
        "the order of their first appearance.",
        "def unique_in_order(xs):\n    return list(dict.fromkeys(xs))\n",
        ["assert unique_in_order([1, 1, 2]) == [1, 2]", "assert unique_in_order([]) == []",
         "assert unique_in_order([3, 2, 3]) == [3, 2]"]),
]


def main() -> None:
    from datasets import Dataset

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the two files")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, records in (("mbpp-train.jsonl", TRAIN), ("mbpp-test.jsonl", TEST)):
        Dataset.from_list(records).to_json(str(args.out / name))
        print(f"wrote {args.out / name} ({len(records)} records)")


if __name__ == "__main__":
    main()
