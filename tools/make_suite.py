"""Generate the shipped synthetic task suite (train and eval splits) from a fixed seed.

Usage: python tools/make_suite.py [--seed 0] [--out mlx_rlaif/data/suites] [--no-check]

Each task is an instance of a *family* (add a constant, filter a list, reverse a string, ...):
a phrasing template, a function name and constants drawn with a seeded RNG. A Python task's
prompt is a HumanEval-style stub (the signature and the phrasing as its docstring) that the
student completes with the body; Python tasks are function io pairs (`entry_point` + `tests:
[{"args": [...], "expected": ...}]`); C++ and Rust tasks are whole programs with
`tests: [{"stdin": ..., "stdout": ...}]`. Every task carries a canonical `solution` (for
supervised tuning; never shown to the student) and a `difficulty` tag.

Held-out eval: the eval split uses the same families as train (so RL on train can transfer) but
function names drawn from a pool train never uses, and, for part of the tasks, a phrasing template
train never uses; no eval prompt equals a train prompt.

Expected outputs come from a Python reference (`ref`) written independently of the canonical
solution text; the check at the end (`--no-check` skips it) runs every canonical solution against
its own tests in a subprocess (C++/Rust only where g++/rustc exist) and fails loudly on any
mismatch. Not covered: floats, multi-file programs, tasks needing imports.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 1234
TRAIN_PER_LANG = {"python": 1280, "cpp": 48, "rust": 48}
EVAL_PER_LANG = {"python": 96, "cpp": 12, "rust": 12}
EVAL_NAME_FRACTION = 0.3  # share of each family's function names reserved for eval
HELD_OUT_TEMPLATE_SHARE = 0.4  # share of eval tasks phrased with the eval-only template

Params = dict[str, Any]


@dataclass(frozen=True)
class Family:
    """A task family. `templates[-1]` is the eval-only phrasing; `body` is the solution text
    (format fields from params); `ref(params, *args)` the independent reference."""

    key: str
    language: str
    difficulty: str
    sig: str  # parameter list, e.g. "x" or "a, b"
    arg: str  # argument generator kind: int, int2, nat, small, list, list1, str, words
    templates: tuple[str, ...]
    body: str
    ref: Callable[..., Any]
    params: Callable[[random.Random], Params] = lambda r: {}


def _k(lo: int, hi: int) -> Callable[[random.Random], Params]:
    return lambda r: {"k": r.randint(lo, hi)}


LETTERS = "abcdefghijklmnopqrstuvwxyz"
WORDS = ("cat", "dog", "sun", "tree", "blue", "apple", "river", "stone", "level", "noon",
         "code", "data", "moon", "star", "racecar", "hello", "world", "bird", "fish", "rain")
# Function names are `{prefix}_{noun}`, the same pools for every family, so a name says nothing
# about the task: the student has to copy it from the prompt. Eval uses combinations train never has.
PREFIXES = ("calc", "get", "make", "find", "apply", "run", "solve", "check", "quick", "simple",
            "magic", "super")
NOUNS = {
    "int": ("value", "number", "num", "x", "item", "total"),
    "list": ("list", "items", "values", "nums", "seq", "data"),
    "str": ("text", "word", "string", "s", "name", "line"),
}
ARG_NOUN = {"int": "int", "int2": "int", "nat": "int", "small": "int", "list": "list",
            "list1": "list", "str": "str", "words": "str"}


def _py(key: str, difficulty: str, sig: str, arg: str, templates: tuple[str, ...], body: str,
        ref: Callable[..., Any],
        params: Callable[[random.Random], Params] = lambda r: {}) -> Family:
    return Family(key, "python", difficulty, sig, arg, templates, body, ref, params)


PY = "Write a Python function that "
CALL = " Call it {name}(%s)."  # naming clauses: dropped from the docstring (`docstring`)
NAME = " Name it {name}(%s)."
PYTHON_FAMILIES = (
    _py("add", "easy", "x", "int", (PY + "returns x plus {k}." + CALL % "x",
        PY + "adds {k} to the integer x and returns the result." + CALL % "x",
        "Implement a function to return the number x increased by {k}." + CALL % "x",
        "Define a function that gives back x + {k}." + NAME % "x"),
        "return x + {k}", lambda p, x: x + p["k"],
        _k(2, 19)),
    _py("sub", "easy", "x", "int", (PY + "returns x minus {k}." + CALL % "x",
        PY + "subtracts {k} from the integer x and returns the result." + CALL % "x",
        "Implement a function to return the number x decreased by {k}." + CALL % "x",
        "Define a function that gives back x - {k}." + NAME % "x"),
        "return x - {k}", lambda p, x: x - p["k"],
        _k(2, 19)),
    _py("mul", "easy", "x", "int", (PY + "returns x multiplied by {k}." + CALL % "x",
        PY + "multiplies the integer x by {k} and returns the result." + CALL % "x",
        "Implement a function to return {k} times the number x." + CALL % "x",
        "Define a function that gives back x * {k}." + NAME % "x"),
        "return x * {k}", lambda p, x: x * p["k"],
        _k(2, 12)),
    _py("mod", "easy", "x", "nat", (PY + "returns the remainder of x divided by {k}." + CALL % "x",
        PY + "returns x modulo {k}." + CALL % "x",
        "Implement a function to return what is left over when x is divided by {k}." + CALL % "x",
        "Define a function that gives back x % {k}." + NAME % "x"),
        "return x % {k}", lambda p, x: x % p["k"],
        _k(2, 11)),
    _py("divisible", "easy", "x", "int", (PY + "returns True if x is divisible by {k}, else False." + CALL % "x",
        PY + "checks whether the integer x is a multiple of {k}." + CALL % "x",
        "Implement a function to return whether {k} divides x evenly." + CALL % "x",
        "Define a function that gives back x % {k} == 0." + NAME % "x"),
        "return x % {k} == 0", lambda p, x: x % p["k"] == 0, _k(2, 9)),
    _py("greater", "easy", "x", "int", (PY + "returns True if x is greater than {k}, else False." + CALL % "x",
        PY + "checks whether the integer x is larger than {k}." + CALL % "x",
        "Implement a function to return whether x exceeds {k}." + CALL % "x",
        "Define a function that gives back x > {k}." + NAME % "x"),
        "return x > {k}", lambda p, x: x > p["k"],
        _k(0, 30)),
    _py("max2", "easy", "a, b", "int2", (PY + "returns the larger of a and b." + CALL % "a, b",
        PY + "returns the maximum of the two integers a and b." + CALL % "a, b",
        "Implement a function to return whichever of a and b is bigger." + CALL % "a, b",
        "Define a function that gives back max(a, b)." + NAME % "a, b"),
        "return max(a, b)", lambda p, a, b: max(a, b)),
    _py("min2", "easy", "a, b", "int2", (PY + "returns the smaller of a and b." + CALL % "a, b",
        PY + "returns the minimum of the two integers a and b." + CALL % "a, b",
        "Implement a function to return whichever of a and b is smaller." + CALL % "a, b",
        "Define a function that gives back min(a, b)." + NAME % "a, b"),
        "return min(a, b)", lambda p, a, b: min(a, b)),
    _py("absdiff", "easy", "a, b", "int2", (PY + "returns the absolute difference of a and b." + CALL % "a, b",
        PY + "returns how far apart the integers a and b are." + CALL % "a, b",
        "Implement a function to return the distance between a and b." + CALL % "a, b",
        "Define a function that gives back abs(a - b)." + NAME % "a, b"),
        "return abs(a - b)", lambda p, a, b: abs(a - b)),
    _py("repeat", "easy", "s", "str", (PY + "returns the string s repeated {k} times." + CALL % "s",
        PY + "returns {k} copies of the string s joined together." + CALL % "s",
        "Implement a function to return s written {k} times in a row." + CALL % "s",
        "Define a function that gives back s * {k}." + NAME % "s"),
        "return s * {k}", lambda p, s: s * p["k"],
        _k(2, 5)),
    _py("upper", "easy", "s", "str", (PY + "returns the string s in upper case." + CALL % "s",
        PY + "converts every letter of s to upper case." + CALL % "s",
        "Implement a function to return s with all letters capitalized." + CALL % "s",
        "Define a function that gives back s.upper()." + NAME % "s"),
        "return s.upper()", lambda p, s: s.upper()),
    _py("reverse", "easy", "s", "str", (PY + "returns the string s reversed." + CALL % "s",
        PY + "returns the characters of s in reverse order." + CALL % "s",
        "Implement a function to return s read backwards." + CALL % "s",
        "Define a function that gives back s[::-1]." + NAME % "s"),
        "return s[::-1]", lambda p, s: s[::-1]),
    _py("prefix", "easy", "s", "str", (PY + 'returns the string s with "{w}" added at the front.' + CALL % "s",
        PY + 'returns "{w}" followed by the string s.' + CALL % "s",
        'Implement a function to return s prefixed with "{w}".' + CALL % "s",
        'Define a function that gives back "{w}" + s.' + NAME % "s"),
        'return "{w}" + s', lambda p, s: p["w"] + s,
        lambda r: {"w": r.choice(WORDS)}),
    _py("sum", "medium", "xs", "list", (PY + "returns the sum of the list of integers xs." + CALL % "xs",
        PY + "adds up all the numbers in the list xs." + CALL % "xs",
        "Implement a function to return the total of the integers in xs." + CALL % "xs",
        "Define a function that gives back sum(xs)." + NAME % "xs"),
        "return sum(xs)", lambda p, xs: sum(xs)),
    _py("scale", "medium", "xs", "list", (PY + "returns a new list with every element of xs multiplied by {k}." + CALL % "xs",
        PY + "multiplies each number in the list xs by {k} and returns the list." + CALL % "xs",
        "Implement a function to return the list xs with each item times {k}." + CALL % "xs",
        "Define a function that gives back [x * {k} for x in xs]." + NAME % "xs"),
        "return [x * {k} for x in xs]", lambda p, xs: [x * p["k"] for x in xs], _k(2, 9)),
    _py("shift", "medium", "xs", "list", (PY + "returns a new list with {k} added to every element of xs." + CALL % "xs",
        PY + "adds {k} to each number in the list xs and returns the list." + CALL % "xs",
        "Implement a function to return the list xs with each item increased by {k}." + CALL % "xs",
        "Define a function that gives back [x + {k} for x in xs]." + NAME % "xs"),
        "return [x + {k} for x in xs]", lambda p, xs: [x + p["k"] for x in xs], _k(1, 15)),
    _py("filter_gt", "medium", "xs", "list", (PY + "returns the elements of xs that are greater than {k}, in order." + CALL % "xs",
        PY + "keeps only the numbers in the list xs larger than {k}." + CALL % "xs",
        "Implement a function to return a list of the items of xs above {k}." + CALL % "xs",
        "Define a function that gives back [x for x in xs if x > {k}]." + NAME % "xs"),
        "return [x for x in xs if x > {k}]", lambda p, xs: [x for x in xs if x > p["k"]], _k(0, 20)),
    _py("count_gt", "medium", "xs", "list", (PY + "returns how many elements of xs are greater than {k}." + CALL % "xs",
        PY + "counts the numbers in the list xs larger than {k}." + CALL % "xs",
        "Implement a function to return the number of items of xs above {k}." + CALL % "xs",
        "Define a function that gives back len([x for x in xs if x > {k}])." + NAME % "xs"),
        "return len([x for x in xs if x > {k}])", lambda p, xs: sum(x > p["k"] for x in xs), _k(0, 20)),
    _py("count_val", "medium", "xs", "list", (PY + "returns how many times {k} appears in xs." + CALL % "xs",
        PY + "counts the occurrences of the number {k} in the list xs." + CALL % "xs",
        "Implement a function to return the number of items of xs equal to {k}." + CALL % "xs",
        "Define a function that gives back xs.count({k})." + NAME % "xs"),
        "return xs.count({k})", lambda p, xs: xs.count(p["k"]), _k(1, 6)),
    _py("max_list", "medium", "xs", "list1", (PY + "returns the largest element of the non-empty list xs." + CALL % "xs",
        PY + "returns the maximum of the numbers in the list xs." + CALL % "xs",
        "Implement a function to return the biggest integer in xs." + CALL % "xs",
        "Define a function that gives back max(xs)." + NAME % "xs"),
        "return max(xs)", lambda p, xs: max(xs)),
    _py("last", "medium", "xs", "list1", (PY + "returns the last element of the non-empty list xs." + CALL % "xs",
        PY + "returns the final item of the list xs." + CALL % "xs",
        "Implement a function to return the element at the end of xs." + CALL % "xs",
        "Define a function that gives back xs[-1]." + NAME % "xs"),
        "return xs[-1]", lambda p, xs: xs[-1]),
    _py("count_char", "medium", "s", "str", (PY + 'returns how many times the letter "{c}" appears in s.' + CALL % "s",
        PY + 'counts the occurrences of "{c}" in the string s.' + CALL % "s",
        'Implement a function to return the number of "{c}" characters in s.' + CALL % "s",
        'Define a function that gives back s.count("{c}").' + NAME % "s"),
        'return s.count("{c}")', lambda p, s: s.count(p["c"]),
        lambda r: {"c": r.choice("aeiorstn")}),
    _py("clamp", "medium", "x", "int", (PY + "returns x limited to the range {lo} to {hi} (inclusive)." + CALL % "x",
        PY + "clamps the integer x between {lo} and {hi}." + CALL % "x",
        "Implement a function to return {lo} if x is below {lo}, {hi} if x is above {hi}, else x." + CALL % "x",
        "Define a function that gives back max({lo}, min({hi}, x))." + NAME % "x"),
        "return max({lo}, min({hi}, x))", lambda p, x: max(p["lo"], min(p["hi"], x)),
        lambda r: (lambda lo: {"lo": lo, "hi": lo + r.randint(5, 30)})(r.randint(-10, 10))),
    _py("evens", "medium", "xs", "list", (PY + "returns the even numbers of xs, in order." + CALL % "xs",
        PY + "keeps only the even integers in the list xs." + CALL % "xs",
        "Implement a function to return a list of the items of xs divisible by 2." + CALL % "xs",
        "Define a function that gives back [x for x in xs if x % 2 == 0]." + NAME % "xs"),
        "return [x for x in xs if x % 2 == 0]", lambda p, xs: [x for x in xs if x % 2 == 0]),
    _py("word_count", "medium", "s", "words", (PY + "returns the number of words in s (words are separated by spaces)." + CALL % "s",
        PY + "counts the space-separated words in the string s." + CALL % "s",
        "Implement a function to return how many words the sentence s has." + CALL % "s",
        "Define a function that gives back len(s.split())." + NAME % "s"),
        "return len(s.split())", lambda p, s: len(s.split())),
    _py("sum_mult", "hard", "n", "small", (PY + "returns the sum of the numbers from 0 to n - 1 that are divisible by {k}." + CALL % "n",
        PY + "adds up every multiple of {k} below n." + CALL % "n",
        "Implement a function to return the total of all i in range(n) with i % {k} == 0." + CALL % "n",
        "Define a function that gives back the sum of multiples of {k} that are less than n." + NAME % "n"),
        "return sum(i for i in range(n) if i % {k} == 0)",
        lambda p, n: sum(i for i in range(n) if i % p["k"] == 0), _k(2, 7)),
    _py("factorial", "hard", "n", "small", (PY + "returns n factorial (the product 1 * 2 * ... * n, and 1 for n = 0)." + CALL % "n",
        PY + "computes the factorial of the non-negative integer n." + CALL % "n",
        "Implement a function to return n!, the product of the integers from 1 to n." + CALL % "n",
        "Define a function that gives back the factorial of n." + NAME % "n"),
        "result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
        lambda p, n: __import__("math").factorial(n)),
    _py("vowels", "hard", "s", "str", (PY + "returns the number of vowels (a, e, i, o, u) in the lowercase string s." + CALL % "s",
        PY + "counts the letters of s that are vowels." + CALL % "s",
        "Implement a function to return how many characters of s are in \"aeiou\"." + CALL % "s",
        "Define a function that gives back the count of vowels in s." + NAME % "s"),
        'return sum(1 for c in s if c in "aeiou")', lambda p, s: sum(c in "aeiou" for c in s)),
    _py("palindrome", "hard", "s", "str", (PY + "returns True if s reads the same forwards and backwards, else False." + CALL % "s",
        PY + "checks whether the string s is a palindrome." + CALL % "s",
        "Implement a function to return whether s equals its reverse." + CALL % "s",
        "Define a function that gives back True exactly when s is a palindrome." + NAME % "s"),
        "return s == s[::-1]", lambda p, s: s == s[::-1]),
    _py("digit_sum", "hard", "n", "nat", (PY + "returns the sum of the decimal digits of the non-negative integer n." + CALL % "n",
        PY + "adds up the digits of n." + CALL % "n",
        "Implement a function to return the total of the digits of n." + CALL % "n",
        "Define a function that gives back the digit sum of n." + NAME % "n"),
        "return sum(int(d) for d in str(n))", lambda p, n: sum(map(int, str(n)))),
    _py("running", "hard", "xs", "list", (PY + "returns the running totals of xs (element i is the sum of xs[0..i])." + CALL % "xs",
        PY + "returns the list of prefix sums of xs." + CALL % "xs",
        "Implement a function to return the cumulative sums of the list xs." + CALL % "xs",
        "Define a function that gives back the running sum of xs as a list." + NAME % "xs"),
        "out = []\n    total = 0\n    for x in xs:\n        total += x\n        out.append(total)\n    return out",
        lambda p, xs: [sum(xs[: i + 1]) for i in range(len(xs))]),
    _py("dedupe", "hard", "xs", "list", (PY + "returns xs without duplicates, keeping the first occurrence of each value in order." + CALL % "xs",
        PY + "removes repeated numbers from the list xs, preserving order." + CALL % "xs",
        "Implement a function to return the distinct items of xs in their original order." + CALL % "xs",
        "Define a function that gives back the unique elements of xs in order." + NAME % "xs"),
        "out = []\n    for x in xs:\n        if x not in out:\n            out.append(x)\n    return out",
        lambda p, xs: list(dict.fromkeys(xs))),
)

CPP_HEAD = "#include <iostream>\nusing namespace std;\n\nint main() {\n"
CPP_STR = "#include <iostream>\n#include <string>\n#include <algorithm>\nusing namespace std;\n\nint main() {\n"
RS_READ = ("use std::io::Read;\n\nfn main() {\n    let mut s = String::new();\n"
           "    std::io::stdin().read_to_string(&mut s).unwrap();\n")
RS_INTS = "    let v: Vec<i64> = s.split_whitespace().map(|t| t.parse().unwrap()).collect();\n"


def _prog(lang: str, key: str, difficulty: str, arg: str, templates: tuple[str, ...],
          body: str, ref: Callable[..., Any],
          params: Callable[[random.Random], Params] = lambda r: {}) -> Family:
    return Family(key, lang, difficulty, "", arg, templates, body, ref, params)


def _stdin_families(lang: str, title: str) -> tuple[Family, ...]:
    """The same program families in C++ and Rust (the body text differs)."""
    w = f"Write a {title} program that reads "
    cpp = lang == "cpp"
    loop_n = "    int n;\n    cin >> n;\n"
    end = "    cout << {out} << endl;\n    return 0;\n}"
    rs_print = '    println!("{}", %s);\n}'
    return (
        _prog(lang, "addk", "easy", "int", (w + "an integer n from standard input and prints n plus {k}.",
              w + "an integer from stdin and prints that integer increased by {k}.",
              f"In {title}, read one whole number from standard input and output it plus {{k}}."),
              CPP_HEAD + "    long long n;\n    cin >> n;\n" + end.replace("{out}", "n + {k}")
              if cpp else RS_READ + RS_INTS + rs_print % "v[0] + {k}",
              lambda p, n: n + p["k"], _k(2, 19)),
        _prog(lang, "mulk", "easy", "int", (w + "an integer n from standard input and prints n multiplied by {k}.",
              w + "an integer from stdin and prints {k} times that integer.",
              f"In {title}, read one whole number from standard input and output it times {{k}}."),
              CPP_HEAD + "    long long n;\n    cin >> n;\n" + end.replace("{out}", "n * {k}")
              if cpp else RS_READ + RS_INTS + rs_print % "v[0] * {k}",
              lambda p, n: n * p["k"], _k(2, 12)),
        _prog(lang, "sum2", "easy", "int2", (w + "two integers from standard input and prints their sum.",
              w + "two integers a and b from stdin and prints a + b.",
              f"In {title}, read two whole numbers from standard input and output their total."),
              CPP_HEAD + "    long long a, b;\n    cin >> a >> b;\n" + end.replace("{out}", "a + b")
              if cpp else RS_READ + RS_INTS + rs_print % "v[0] + v[1]",
              lambda p, a, b: a + b),
        _prog(lang, "countgt", "medium", "list", (w + "an integer n and then n integers from standard input and prints how many of them are greater than {k}.",
              w + "a count n followed by n integers from stdin and prints the number of those integers above {k}.",
              f"In {title}, read n and then n whole numbers from standard input and output how many exceed {{k}}."),
              CPP_HEAD + loop_n + "    int count = 0;\n    for (int i = 0; i < n; i++) {\n"
              "        long long x;\n        cin >> x;\n        if (x > {k}) count++;\n    }\n"
              + end.replace("{out}", "count")
              if cpp else RS_READ + RS_INTS + rs_print % "v[1..].iter().filter(|&&x| x > {k}).count()",
              lambda p, xs: sum(x > p["k"] for x in xs), _k(0, 20)),
        _prog(lang, "sumn", "medium", "list", (w + "an integer n and then n integers from standard input and prints their sum.",
              w + "a count n followed by n integers from stdin and prints the total of the n integers.",
              f"In {title}, read n and then n whole numbers from standard input and output their sum."),
              CPP_HEAD + loop_n + "    long long total = 0;\n    for (int i = 0; i < n; i++) {\n"
              "        long long x;\n        cin >> x;\n        total += x;\n    }\n"
              + end.replace("{out}", "total")
              if cpp else RS_READ + RS_INTS + rs_print % "v[1..].iter().sum::<i64>()",
              lambda p, xs: sum(xs)),
        _prog(lang, "maxn", "medium", "list1", (w + "an integer n and then n integers from standard input and prints the largest of them.",
              w + "a count n followed by n integers from stdin and prints the maximum of the n integers.",
              f"In {title}, read n and then n whole numbers from standard input and output the biggest one."),
              CPP_HEAD + loop_n + "    long long best, x;\n    cin >> best;\n    for (int i = 1; i < n; i++) {\n"
              "        cin >> x;\n        if (x > best) best = x;\n    }\n" + end.replace("{out}", "best")
              if cpp else RS_READ + RS_INTS + rs_print % "v[1..].iter().max().unwrap()",
              lambda p, xs: max(xs)),
        _prog(lang, "revword", "medium", "str", (w + "a word from standard input and prints it reversed.",
              w + "one word from stdin and prints its letters in reverse order.",
              f"In {title}, read a single word from standard input and output it backwards."),
              CPP_STR + "    string s;\n    cin >> s;\n    reverse(s.begin(), s.end());\n"
              + end.replace("{out}", "s")
              if cpp else RS_READ + '    let r: String = s.trim().chars().rev().collect();\n' + rs_print % "r",
              lambda p, s: s[::-1]),
        _prog(lang, "repeatk", "medium", "str", (w + "a word from standard input and prints it {k} times with no spaces.",
              w + "one word from stdin and prints {k} copies of it joined together.",
              f"In {title}, read a single word from standard input and output it repeated {{k}} times."),
              CPP_STR + "    string s;\n    cin >> s;\n    for (int i = 0; i < {k}; i++) cout << s;\n"
              "    cout << endl;\n    return 0;\n}"
              if cpp else RS_READ + rs_print % "s.trim().repeat({k})",
              lambda p, s: s * p["k"], _k(2, 5)),
        _prog(lang, "summult", "hard", "small", (w + "an integer n from standard input and prints the sum of the numbers from 0 to n - 1 that are divisible by {k}.",
              w + "an integer n from stdin and prints the total of all multiples of {k} below n.",
              f"In {title}, read a whole number n from standard input and output the sum of every multiple of {{k}} less than n."),
              CPP_HEAD + "    long long n, total = 0;\n    cin >> n;\n"
              "    for (long long i = 0; i < n; i++) {\n        if (i % {k} == 0) total += i;\n    }\n"
              + end.replace("{out}", "total")
              if cpp else RS_READ + RS_INTS + rs_print % "(0..v[0]).filter(|i| i % {k} == 0).sum::<i64>()",
              lambda p, n: sum(i for i in range(n) if i % p["k"] == 0), _k(2, 7)),
    )


FAMILIES = PYTHON_FAMILIES + _stdin_families("cpp", "C++") + _stdin_families("rust", "Rust")


def gen_args(r: random.Random, kind: str) -> list[Any]:
    """One call's arguments for an argument kind."""
    if kind == "int":
        return [r.randint(-30, 60)]
    if kind == "int2":
        return [r.randint(-50, 50), r.randint(-50, 50)]
    if kind == "nat":
        return [r.randint(0, 999)]
    if kind == "small":
        return [r.randint(0, 12)]
    if kind in ("list", "list1"):
        n = r.randint(1 if kind == "list1" else 0, 7)
        return [[r.randint(-5, 25) for _ in range(n)]]
    if kind == "str":
        return [r.choice(WORDS) if r.random() < 0.6 else "".join(r.choices(LETTERS, k=r.randint(0, 8)))]
    if kind == "words":
        return [" ".join(r.choices(WORDS, k=r.randint(0, 6)))]
    raise ValueError(f"unknown argument kind {kind!r}")


def split_names(r: random.Random) -> dict[str, tuple[list[str], list[str]]]:
    """(train names, eval names) per argument noun kind: disjoint pools of prefix_noun names."""
    pools = {}
    for kind, nouns in sorted(NOUNS.items()):
        names = sorted(f"{p}_{n}" for p in PREFIXES for n in nouns)
        r.shuffle(names)
        cut = int(len(names) * EVAL_NAME_FRACTION)
        pools[kind] = (names[cut:], names[:cut])
    return pools


def draw_train_tasks(n: int, seed: int, language: str = "python") -> list[dict[str, Any]]:
    """`n` more tasks from the train split's distribution: train names and phrasings only, so
    none can equal an eval prompt (for supervised data beyond the shipped split)."""
    pools = split_names(random.Random(SEED))  # the pools `build` draws first
    r = random.Random(seed)
    fams = [f for f in FAMILIES if f.language == language]
    out = []
    for i in range(n):
        fam = r.choice(fams)
        names = pools[ARG_NOUN[fam.arg]][0] if language == "python" else []
        task = make_task(fam, r, "train", names, held_out=False)
        out.append({**task, "id": f"synthetic/drawn/{language}/{i:06d}"})
    return out


def stdin_text(fam: Family, args: list[Any]) -> str:
    if fam.arg in ("list", "list1"):
        xs = args[0]
        return f"{len(xs)}\n{' '.join(map(str, xs))}\n"
    if fam.arg == "str":
        return f"{args[0] or 'x'}\n"
    return " ".join(map(str, args)) + "\n"


def make_tests(fam: Family, p: Params, r: random.Random, n: int = 5) -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(50 * n):
        args = gen_args(r, fam.arg)
        if fam.language != "python" and fam.arg == "str":
            args = [args[0] or "x"]
        key = json.dumps(args)
        if key in seen:
            continue
        seen.add(key)
        out = fam.ref(p, *args)
        if fam.language == "python":
            tests.append({"args": args, "expected": out})
        else:
            tests.append({"stdin": stdin_text(fam, args), "stdout": f"{out}\n"})
        if len(tests) == n:
            break
    return tests


def fill(body: str, p: Params) -> str:
    """Substitute `{key}` fields of a solution body (which may hold other braces)."""
    for key, value in p.items():
        body = body.replace("{" + key + "}", str(value))
    return body


_LEADS = (PY, "Implement a function to ", "Define a function that ")


def unquote(text: str, p: Params) -> str:
    """`"{w}"` -> `{w}` for each parameter: a parameter that is a string value in the prompt
    is a name once it becomes a keyword parameter."""
    for key in p:
        text = text.replace('"{' + key + '}"', "{" + key + "}")
    return text


def docstring(sentence: str) -> str:
    """A Python phrasing as the docstring of the prompt's stub: without its lead-in ("Write a
    Python function that") and naming clause ("Call it f(x).")."""
    text = sentence.split(" Call it ")[0].split(" Name it ")[0]
    for lead in _LEADS:
        text = text.removeprefix(lead)
    return text[:1].upper() + text[1:]


def make_task(fam: Family, r: random.Random, split: str, names: list[str],
              held_out: bool) -> dict[str, Any]:
    p = fam.params(r)
    templates = fam.templates[-1:] if held_out else fam.templates[:-1]
    template = r.choice(templates)
    name = r.choice(names) if names else ""
    prompt = template.format(name=name, **p)
    body = fill(fam.body, p)
    if fam.language == "python":
        # constants are keyword parameters with defaults: the docstring and body name them
        sig = ", ".join([fam.sig, *(f"{k}={v!r}" for k, v in p.items())])
        by_name = {k: k for k in p}
        prompt = docstring(unquote(template, p).format(name=name, **by_name))
        prompt = f'def {name}({sig}):\n    """{prompt}"""\n'
        solution = f"def {name}({sig}):\n    {fill(unquote(fam.body, p), by_name)}\n"
    else:
        solution = body + "\n"
    task = {"id": "", "prompt": prompt, "language": fam.language, "difficulty": fam.difficulty,
            "family": fam.key, "split": split, "tests": make_tests(fam, p, r), "solution": solution}
    if fam.language == "python":
        task["entry_point"] = name
    return task


def build(seed: int = SEED) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) task lists, deterministic in `seed`."""
    r = random.Random(seed)
    pools = split_names(r)
    train: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    for lang in ("python", "cpp", "rust"):
        fams = [f for f in FAMILIES if f.language == lang]
        for split, counts, out in (("eval", EVAL_PER_LANG, evals), ("train", TRAIN_PER_LANG, train)):
            seen = {t["prompt"] for t in train + evals}
            made = 0
            for i in range(counts[lang] * 50):
                if made == counts[lang]:
                    break
                fam = fams[i % len(fams)]
                # a program family without constants has few prompts: eval gets the held-out one
                fixed = lang != "python" and not fam.params(random.Random(0))
                held = split == "eval" and (fixed or r.random() < HELD_OUT_TEMPLATE_SHARE)
                names = pools[ARG_NOUN[fam.arg]][split == "eval"] if lang == "python" else []
                task = make_task(fam, r, split, names, held)
                if task["prompt"] in seen:
                    continue
                seen.add(task["prompt"])
                task["id"] = f"synthetic/{split}/{lang}/{made:04d}"
                out.append(task)
                made += 1
    return train, evals


_PY_RUNNER = """
import json, sys
cases = json.load(sys.stdin)
out = []
for code, entry, args in cases:
    ns = {}
    exec(code, ns)
    out.append(ns[entry](*args))
print(json.dumps(out))
"""


def check_python(tasks: list[dict[str, Any]]) -> list[str]:
    """Ids of Python tasks whose solution fails one of its tests (run in one subprocess)."""
    cases = [(t["solution"], t["entry_point"], c["args"]) for t in tasks for c in t["tests"]]
    res = subprocess.run([sys.executable, "-c", _PY_RUNNER], input=json.dumps(cases),
                         capture_output=True, text=True, timeout=120, check=True)
    got = iter(json.loads(res.stdout))
    return [t["id"] for t in tasks if [next(got) for _ in t["tests"]]
            != [c["expected"] for c in t["tests"]]]


def compile_cmd(lang: str, src: Path, exe: Path) -> list[str] | None:
    if lang == "cpp":
        cxx = shutil.which("g++") or shutil.which("clang++")
        return [cxx, "-O0", "-o", str(exe), str(src)] if cxx else None
    rustc = shutil.which("rustc")
    return [rustc, "-C", "opt-level=0", "-o", str(exe), str(src)] if rustc else None


def check_program(task: dict[str, Any]) -> bool | None:
    """Whether a C++/Rust solution passes its tests; None when the toolchain is missing."""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / ("main.cpp" if task["language"] == "cpp" else "main.rs")
        exe = Path(d) / "main"
        src.write_text(task["solution"])
        cmd = compile_cmd(task["language"], src, exe)
        if cmd is None:
            return None
        if subprocess.run(cmd, capture_output=True, timeout=120).returncode != 0:
            return False
        for c in task["tests"]:
            res = subprocess.run([str(exe)], input=c["stdin"], capture_output=True, text=True,
                                 timeout=10)
            if res.returncode != 0 or res.stdout.strip() != c["stdout"].strip():
                return False
    return True


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--out", type=Path, default=Path("mlx_rlaif/data/suites"))
    ap.add_argument("--no-check", action="store_true", help="skip running canonical solutions")
    args = ap.parse_args(argv)
    train, evals = build(args.seed)
    if not args.no_check:
        tasks = train + evals
        bad = check_python([t for t in tasks if t["language"] == "python"])
        bad += [t["id"] for t in tasks if t["language"] != "python" and check_program(t) is False]
        if bad:
            print(f"canonical solutions fail their tests: {bad[:10]}", file=sys.stderr)
            return 1
    write_jsonl(args.out / "synthetic-train.jsonl", train)
    write_jsonl(args.out / "synthetic-eval.jsonl", evals)
    print(f"wrote {len(train)} train and {len(evals)} eval tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
