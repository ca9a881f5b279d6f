"""Measure pass@k of a chat model on a suite: sample with mlx-lm, run candidates against io tests.

Usage (fast BLAS on Linux):
  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \
  python tools/measure_passk.py --model models/tiny-coder --suite synthetic-eval -n 8 --temp 0.7

Covered: prompts in chat format (the task prompt as the user message), all samples of all tasks
decoded together by mlx-lm's BatchGenerator, the unbiased pass@k estimator, io-pair Python tasks
and stdin/stdout programs (Python, C++ with g++/clang++, Rust with rustc).
Not covered: sandboxing. Candidates run in a plain subprocess with a timeout, which is enough for
measuring our own model while building it and nothing else; the trainer's reward is the
sandboxed `mlx_rlaif.rewards.exec`. HumanEval-style `test` code is not handled here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlx_rlaif.code import extract_code  # noqa: E402

TIMEOUT_S = 5.0
_HARNESS = """
import json, sys
cases = json.loads(sys.stdin.read())
ns = {}
exec(compile(open("candidate.py").read(), "candidate.py", "exec"), ns)
out = []
for args in cases:
    try:
        out.append(json.dumps(ns[%r](*args)))
    except Exception as e:
        out.append("error: " + type(e).__name__)
print(json.dumps(out))
"""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c pass (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def chat_prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                              add_generation_prompt=True))


def sample(model: Any, tokenizer: Any, prompts: Sequence[str], n: int, temp: float,
           max_tokens: int, seed: int = 0, top_p: float = 1.0) -> list[dict[str, Any]]:
    """n samples per prompt, prompt-major: dicts with text, tokens, finish_reason."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(seed)
    ids = [chat_prompt_ids(tokenizer, p) for p in prompts for _ in range(n)]
    gen = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids],
                         sampler=make_sampler(temp=temp, top_p=top_p),
                         completion_batch_size=max(32, min(len(ids), 256)))
    uids = gen.insert(ids, [max_tokens] * len(ids))
    toks: dict[int, list[int]] = {u: [] for u in uids}
    reason: dict[int, str] = {}
    while responses := gen.next_generated():
        for r in responses:
            toks[r.uid].append(r.token)
            if r.finish_reason is not None:
                reason[r.uid] = r.finish_reason
    gen.close()
    eos = set(tokenizer.eos_token_ids)
    out = []
    for u in uids:
        body = [t for t in toks[u] if t not in eos]
        out.append({"text": tokenizer.decode(body), "tokens": len(toks[u]),
                    "finish_reason": reason.get(u, "length")})
    return out


def _run_python(code: str, task: dict[str, Any], d: Path) -> bool:
    (d / "candidate.py").write_text(code)
    if task.get("entry_point"):
        tests = task["tests"]
        res = subprocess.run([sys.executable, "-c", _HARNESS % task["entry_point"]], cwd=d,
                             input=json.dumps([t["args"] for t in tests]), capture_output=True,
                             text=True, timeout=TIMEOUT_S)
        if res.returncode != 0:
            return False
        got = json.loads(res.stdout.strip().splitlines()[-1])
        return got == [json.dumps(t["expected"]) for t in tests]
    return _run_stdin([sys.executable, "candidate.py"], task, d)


def _run_stdin(cmd: list[str], task: dict[str, Any], d: Path) -> bool:
    for t in task["tests"]:
        res = subprocess.run(cmd, cwd=d, input=t["stdin"], capture_output=True, text=True,
                             timeout=TIMEOUT_S)
        if res.returncode != 0 or res.stdout.strip() != t["stdout"].strip():
            return False
    return True


def _build(lang: str, code: str, d: Path) -> list[str] | None:
    src = d / ("main.cpp" if lang == "cpp" else "main.rs")
    src.write_text(code)
    tool = (shutil.which("g++") or shutil.which("clang++")) if lang == "cpp" else shutil.which("rustc")
    if tool is None:
        raise RuntimeError(f"no compiler for {lang} on PATH")
    res = subprocess.run([tool, "-o", str(d / "main"), str(src)], capture_output=True,
                         timeout=60)
    return [str(d / "main")] if res.returncode == 0 else None


def check(task: dict[str, Any], completion: str) -> bool:
    """Whether the code in `completion` passes all of the task's io tests."""
    code = extract_code(completion, task["language"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            if task["language"] == "python":
                return _run_python(code, task, d)
            cmd = _build(task["language"], code, d)
            return cmd is not None and _run_stdin(cmd, task, d)
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError, UnicodeDecodeError):
        return False


def measure(model: Any, tokenizer: Any, tasks: Sequence[dict[str, Any]], n: int = 4,
            temp: float = 0.7, max_tokens: int = 128, seed: int = 0,
            ks: Sequence[int] = (1,)) -> dict[str, Any]:
    """pass@k figures and per-task results of `n` samples per task."""
    t0 = time.perf_counter()
    samples = sample(model, tokenizer, [t["prompt"] for t in tasks], n, temp, max_tokens, seed)
    gen_s = time.perf_counter() - t0
    pairs = [(tasks[i // n], s["text"]) for i, s in enumerate(samples)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        ok = list(pool.map(lambda p: check(*p), pairs))
    per_task = []
    for i, task in enumerate(tasks):
        group = samples[i * n:(i + 1) * n]
        per_task.append({"id": task["id"], "family": task.get("family"),
                         "language": task["language"], "passed": sum(ok[i * n:(i + 1) * n]),
                         "n": n, "samples": [s["text"] for s in group]})
    res: dict[str, Any] = {f"pass@{k}": _mean([pass_at_k(n, r["passed"], k) for r in per_task])
                           for k in ks if k <= n}
    res["frac_eos"] = _mean([s["finish_reason"] == "stop" for s in samples])
    res["mean_tokens"] = _mean([s["tokens"] for s in samples])
    res["gen_s"] = gen_s
    res["check_s"] = time.perf_counter() - t0 - gen_s
    res["by_language"] = _group(per_task, "language")
    res["per_task"] = per_task
    return res


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _group(per_task: list[dict[str, Any]], key: str) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for r in per_task:
        out.setdefault(r[key], []).append(r["passed"] / r["n"])
    return {k: round(_mean(v), 4) for k, v in sorted(out.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="pass@k of a chat model on a task suite")
    ap.add_argument("--model", default="models/tiny-coder")
    ap.add_argument("--suite", default="synthetic-eval", help="shipped suite name or JSONL file")
    ap.add_argument("--language", default=None, help="only tasks of this language")
    ap.add_argument("-n", type=int, default=8, help="samples per task")
    ap.add_argument("--temp", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="per-task results JSONL")
    args = ap.parse_args(argv)

    from mlx_lm import load

    from mlx_rlaif.suites import SUITES, load_suite

    if args.suite in SUITES:
        tasks = load_suite(args.suite)
    else:
        tasks = [json.loads(x) for x in Path(args.suite).read_text().splitlines() if x.strip()]
    if args.language:
        tasks = [t for t in tasks if t["language"] == args.language]
    model, tokenizer = load(args.model)
    res = measure(model, tokenizer, tasks, args.n, args.temp, args.max_tokens, args.seed,
                  ks=(1, 2, 4, 8))
    per_task = res.pop("per_task")
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in per_task))
    fam = _group(per_task, "family")
    print(json.dumps({"model": args.model, "suite": args.suite, "tasks": len(tasks), "n": args.n,
                      "temp": args.temp, "max_tokens": args.max_tokens, **res,
                      "by_family": fam}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
