"""Where a 20-test stdin/stdout completion's time goes (issue 49): the exec reward's
`score_one` on the `a b -> a + b` task, with the build, the sandbox start (the first test's
time includes it), each later test and the session's end timed from outside (runs.Session).

Usage: python tools/profile_runs.py [bwrap|process] [python|cpp] [--n 12]
Prints medians over N distinct completions, 1 worker. Not covered: the split inside a test
(fork, the run's setup, the program, its exit), which needs the launcher instrumented.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlx_rlaif.config import ExecConfig  # noqa: E402
from mlx_rlaif.records import Task  # noqa: E402
from mlx_rlaif.rewards.exec import ExecReward  # noqa: E402
from mlx_rlaif.sandbox import runs  # noqa: E402

PY = "# v{i}\na, b = map(int, input().split())\nprint(a + b)\n"
CPP = ("// v{i}\n#include <iostream>\n"
       "int main(){{long long a,b; std::cin>>a>>b; std::cout<<a+b<<'\\n';}}\n")


def timed(times: list[float], fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            times.append(time.perf_counter() - t)
    return wrapper


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="bwrap")
    ap.add_argument("language", nargs="?", default="python", choices=["python", "cpp"])
    ap.add_argument("--n", type=int, default=12)
    args = ap.parse_args()
    tests = tuple({"stdin": f"{k} {k * k}\n", "stdout": f"{k + k * k}\n"} for k in range(20))
    task = Task(id="sum", prompt="Print a + b.", language=args.language, tests=tests)
    reward = ExecReward(ExecConfig(sandbox=args.mode, workers=1, uid_base=64600),
                        {args.language})
    tests_t, close_t, build_t, total = [], [], [], []
    runs.Session.test = timed(tests_t, runs.Session.test)
    runs.Session.close = timed(close_t, runs.Session.close)
    reward._build = timed(build_t, reward._build)
    code = PY if args.language == "python" else CPP
    try:
        for i in range(args.n):
            t = time.perf_counter()
            r = reward.score_one(task, code.format(i=i))
            total.append(time.perf_counter() - t)
            assert r.value == 1.0, r.reason
    finally:
        reward.close()
    first = tests_t[::len(tests)]
    rest = [x for i, x in enumerate(tests_t) if i % len(tests)]
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    print(f"{args.mode} {args.language}: {ms(total):.1f} ms a completion; build "
          f"{ms(build_t):.1f} ms; first test (with the sandbox start) {ms(first):.1f} ms; "
          f"each later test {ms(rest):.2f} ms; session end {ms(close_t):.1f} ms "
          f"(medians of {args.n})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
