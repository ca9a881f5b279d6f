"""Speculative rollouts (generation.speculative: ngram) against decoding one token per pass:
accepted tokens per forward pass and decode tokens/s, interleaved in one process.

    python tools/bench_speculative.py --quick          # the tiny model's two task sets
    python tools/bench_speculative.py                  # and the 0.5B shape on HumanEval
    python tools/bench_speculative.py --only humaneval --widths 1,8 --draft 2,4

Workloads:
- `quickstart`: the shipped tiny model on the quickstart's tasks (easy Python tasks of
  synthetic-train), P = 4 prompts x G = 8, 64 tokens, T = 1.0;
- `medium-hard`: the same model on the medium and hard Python tasks of synthetic-eval;
- `humaneval`: the Qwen2.5-0.5B shape (random weights, Qwen's tokenizer) on HumanEval prompts,
  each of a batch's rows completing its prompt with the canonical solution. Random weights do
  not write code, so the completion is forced: the model's real forward runs at its real cost,
  and a bonus of 50 on the logit of the canonical solution's next token makes the sampler pick
  it (`Forced`). What this measures is the rollout speed of a model whose completions copy
  what HumanEval's solutions copy from their prompts (signatures, names, docstring examples);
  the acceptance is that of the n-gram drafts on those solutions. `--widths` sets the rows
  decoded together (G copies of one prompt; several prompts one after the other);
- `humaneval-repair`: the same, as the second answer of a conversation (generation.max_turns
  2): the prompt holds a first answer that failed (the canonical solution with its first `<`,
  `>` or `==` changed), a line saying so and the stub again; the completion is the canonical
  solution, which the first answer mostly spells out.

Arms: `compiled` (one token per pass, compiled_decode.py: what rollouts use by default),
`eager` (one token per pass, decode.py's eager loop: the same Python-level loop as the drafting
one, so the ratio to it isolates the fewer passes from the compiled step), and `ngram k` for
each `--draft` k (speculative.py). Reported per arm: tokens/s (median of the repetitions),
tokens per row and forward pass, the share of drafted tokens kept.

Not covered: Apple silicon (where one pass's cost grows little with its width: decoding is bound
by reading the weights); the CPU build here is bound by arithmetic from a few rows on, so a
pass 5 positions wide costs up to 5 times one position.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the tiny model's workloads only")
    p.add_argument("--only", default="", help="workloads, comma-separated")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--draft", default="2,4", help="draft_tokens of the ngram arms")
    p.add_argument("--widths", default="1,4,16", help="humaneval: rows decoded together")
    p.add_argument("--prompts", type=int, default=4, help="humaneval: prompts (one after another)")
    p.add_argument("--out", default=str(ROOT / ".bench" / "speculative.json"))
    args = p.parse_args()
    from mlx_rlaif.cpu.blas import maybe_reexec_with_fast_blas

    maybe_reexec_with_fast_blas([sys.executable, *sys.argv])
    names = args.only.split(",") if args.only else (
        ["quickstart", "medium-hard"] + ([] if args.quick else ["humaneval",
                                                                "humaneval-repair"]))
    drafts = [int(x) for x in args.draft.split(",")]
    results = {"command": "python tools/bench_speculative.py " + " ".join(sys.argv[1:])}
    for name in names:
        if name in ("humaneval", "humaneval-repair"):
            for width in (int(x) for x in args.widths.split(",")):
                key = f"{name}, {width} rows"
                results[key] = humaneval(width, args.prompts, drafts, args.reps,
                                         name == "humaneval-repair")
                show(key, results[key])
        else:
            results[name] = tiny(name, drafts, args.reps)
            show(name, results[name])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


def show(name: str, arms: dict[str, dict]) -> None:
    base = arms["compiled"]["tokens_per_s"]
    for arm, r in arms.items():
        extra = (f"  {r['tokens_per_pass']:.2f} tok/pass, {r['draft_accept']:.0%} of drafts kept"
                 if "tokens_per_pass" in r else "")
        print(f"{name:>24} | {arm:>9} | {r['tokens_per_s']:8.1f} tok/s "
              f"({r['tokens_per_s'] / base:.2f}x compiled){extra}", flush=True)


def arms_of(drafts: list[int]) -> list[tuple[str, int, bool]]:
    """(name, draft_tokens, compiled) of each arm."""
    return [("compiled", 0, True), ("eager", 0, False),
            *((f"ngram {k}", k, False) for k in drafts)]


def measure(run: Any, drafts: list[int], reps: int) -> dict[str, dict]:
    """`run(draft_tokens, compiled)` -> (tokens, seconds, stats), interleaved by repetition
    after one warm-up of each arm."""
    arms = arms_of(drafts)
    for _, k, compiled in arms:
        run(k, compiled)
    rows: dict[str, list] = {name: [] for name, _, _ in arms}
    for _ in range(reps):
        for name, k, compiled in arms:
            rows[name].append(run(k, compiled))
    out = {}
    for name, rs in rows.items():
        r = {"tokens_per_s": statistics.median(t / s for t, s, _ in rs),
             "tokens": statistics.median(t for t, _, _ in rs)}
        if "gen/tokens_per_pass" in rs[0][2]:
            r["tokens_per_pass"] = statistics.median(x[2]["gen/tokens_per_pass"] for x in rs)
            r["draft_accept"] = statistics.median(x[2]["gen/draft_accept"] for x in rs)
        out[name] = r
    return out


def tiny(name: str, drafts: list[int], reps: int) -> dict[str, dict]:
    import mlx.core as mx
    from mlx_lm import load

    from mlx_rlaif.assets import resolve_model
    from mlx_rlaif.backends.mlx.rollout import generate
    from mlx_rlaif.backends.sampling import SamplingParams, prompt_formatter
    from mlx_rlaif.data.tasks import load_tasks

    model, tok = load(resolve_model("builtin:tiny-coder"))
    fmt = prompt_formatter(tok)
    if name == "quickstart":
        tasks = [t for t in load_tasks("suite:synthetic-train", ["python"])
                 if t.difficulty == "easy"]
    else:
        tasks = [t for t in load_tasks("suite:synthetic-eval", ["python"])
                 if t.difficulty in ("medium", "hard")]
    batches = [[fmt(t) for t in tasks[i:i + 4]] for i in range(0, 16, 4)]
    eos = [tok.eos_token_id]
    state = {"i": 0}

    def run(k: int, compiled: bool) -> tuple[int, float, dict]:
        prompts = batches[state["i"] % len(batches)]
        state["i"] += 1
        mx.random.seed(state["i"])
        params = SamplingParams(temperature=1.0, max_new_tokens=64, draft_tokens=k)
        tic = time.perf_counter()
        seqs, stats = generate(model, prompts, 8, params, eos, compiled=compiled)
        return sum(len(s["tokens"]) for s in seqs), time.perf_counter() - tic, stats

    return measure(run, drafts, reps)


class Forced:
    """A model whose next token is the target's: its own logits (the real forward's cost) with
    a bonus of 50 on `target[position + 1]` (the canonical completion; past its end, `eos`).
    Every row decodes the same prompt (the position is the row's cache offset)."""

    def __new__(cls, model: Any, target: list[int], eos: int) -> Any:
        import mlx.core as mx
        import mlx.nn as nn

        class _Forced(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = model
                self._target = mx.array([*target, eos, eos], dtype=mx.int32)

            @property
            def layers(self) -> Any:
                return self.inner.layers

            def __call__(self, x: mx.array, cache: Any = None) -> mx.array:
                start = cache[0].offset  # each row's position of its first input token
                logits = self.inner(x, cache=cache)
                pos = mx.array(start).reshape(-1, 1) + mx.arange(x.shape[1]) + 1
                nxt = self._target[mx.minimum(pos, self._target.shape[0] - 1)]
                hit = mx.arange(logits.shape[-1]) == nxt[..., None]
                return mx.where(hit, logits + 50.0, logits)

        return _Forced()


def broken(body: str) -> str:
    """`body` with its first comparison changed (a first answer that fails its tests)."""
    for a, b in (("<", ">"), (">", "<"), ("==", "!=")):
        if a in body:
            return body.replace(a, b, 1)
    return body + "\n    pass"


def humaneval(width: int, n_prompts: int, drafts: list[int], reps: int, repair: bool = False
              ) -> dict[str, dict]:
    import mlx.core as mx
    from mlx_lm import load

    from mlx_rlaif.backends.mlx.rollout import generate
    from mlx_rlaif.backends.sampling import SamplingParams
    from mlx_rlaif.data.suites import load_suite
    from mlx_rlaif.testing.randmodel import make_model_dir

    path = ROOT / ".bench" / "models" / "qwen0.5b-qwen-tok"
    if not (path / "config.json").is_file():
        make_model_dir(path, "qwen0.5b", seed=0, tokenizer="qwen")
    model, tok = load(str(path))
    eos = tok.eos_token_id
    problems = list(load_suite("humaneval"))[:n_prompts]
    pairs = []
    for p in problems:
        body = p["solution"][len(p["prompt"]):]
        text = p["prompt"]
        if repair:
            text = (f"{p['prompt']}{broken(body)}\n\n# That answer failed its tests. The "
                    f"corrected function:\n{p['prompt']}")
        prompt = tok.encode(text)
        pairs.append((prompt, prompt + tok.encode(body)))
    longest = max(len(f) - len(p) for p, f in pairs)
    state = {"i": 0}

    def run(k: int, compiled: bool) -> tuple[int, float, dict]:
        tokens, seconds, stats = 0, 0.0, {}
        for prompt, full in pairs:
            state["i"] += 1
            mx.random.seed(state["i"])
            forced = Forced(model, full, eos)
            params = SamplingParams(temperature=1.0, max_new_tokens=longest + 1, draft_tokens=k,
                                    fuse_lora_max_mb=0)
            tic = time.perf_counter()
            seqs, s = generate(forced, [prompt], width, params, [eos], compiled=compiled)
            seconds += time.perf_counter() - tic
            tokens += sum(len(x["tokens"]) for x in seqs)
            got = seqs[0]["tokens"][:-1]
            if got != full[len(prompt):]:
                raise SystemExit("bench: the forced completion is not the canonical solution")
            for key in ("gen/tokens_per_pass", "gen/draft_accept"):
                if key in s:
                    stats.setdefault(key, []).append(s[key])
        return tokens, seconds, {k: statistics.mean(v) for k, v in stats.items()}

    return measure(run, drafts, reps)


if __name__ == "__main__":
    sys.exit(main())
