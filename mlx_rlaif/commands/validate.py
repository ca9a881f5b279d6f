"""`mlx-rlaif validate`: the baseline model against the fine-tuned one on the same prompts.

Both models generate for the same tasks with the same seed and sampling settings (greedy by
default), one model in memory at a time; every completion is scored by the configured reward
(`rewards.build.build_reward`: exec, syntax, teacher or mix). The report holds each model's mean
score and generation speed, the improvement (absolute and %), how many prompts improved, degraded
or stayed equal, and the per-prompt comparisons; it is printed with rich and written as JSON.

The fine-tuned side is a run directory or checkpoint (its base model + adapters) or a plain model
directory (e.g. `mlx-rlaif fuse` output). A completion whose reward is None (unscorable) counts
in neither mean; a prompt with no scored completion on either side counts as "unscored".

Not covered: significance tests, pass@k for k > 1 (use `mlx-rlaif eval`).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..terminal import text

HELP = "Compare a fine-tuned model with its baseline on the same prompts; report and JSON."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", required=True, metavar="MODEL",
                   help="Baseline model: a model directory or hub id (e.g. the base model).")
    p.add_argument("--fine-tuned", required=True, metavar="RUN_OR_CKPT",
                   help="A run directory, a checkpoint, or a (fused) model directory.")
    p.add_argument("--prompts", required=True, metavar="FILE",
                   help="Tasks: a JSONL file ({\"prompt\", \"language\", tests...}) or suite:NAME.")
    p.add_argument("--model", default=None, metavar="BASE",
                   help="Base model of the fine-tuned adapters (default: their base_model).")
    p.add_argument("--reward", choices=("exec", "syntax", "teacher", "mix"), default=None,
                   help="Scorer (default: the config's reward.type, or teacher with --teacher).")
    p.add_argument("--teacher", choices=("anthropic", "openai"), default=None,
                   help="Teacher API that grades the completions (key from the environment).")
    p.add_argument("--teacher-model", default=None, help="Teacher model name.")
    p.add_argument("--teacher-base-url", default=None,
                   help="Base URL of an OpenAI-compatible server.")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="A training config to take reward, model and generation settings from.")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="Override a config value (repeatable).")
    p.add_argument("-n", "--max-samples", type=int, default=0, metavar="N",
                   help="Use the first N prompts (0: all).")
    p.add_argument("--samples-per-prompt", type=int, default=1, metavar="G",
                   help="Completions per prompt and model (scores are averaged per prompt).")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="Sampling temperature (0: greedy, the default).")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="Most tokens per completion (default: generation.max_new_tokens).")
    p.add_argument("--seed", type=int, default=0, help="Sampling seed, the same for both models.")
    p.add_argument("--out", default="validation_results.json", metavar="FILE",
                   help="Where to write the JSON report.")
    p.add_argument("--print-chars", type=int, default=400,
                   help="Characters of each completion shown in the printed examples.")
    p.add_argument("--show", type=int, default=3, help="Example comparisons printed.")


# --- the comparison (pure) ----------------------------------------------------------------------


def prompt_means(scores_PG: Sequence[float | None], group_size: int) -> list[float | None]:
    """Mean scored value per prompt (None when none of its completions could be scored)."""
    out = []
    for p in range(0, len(scores_PG), group_size):
        vals = [v for v in scores_PG[p:p + group_size] if v is not None]
        out.append(sum(vals) / len(vals) if vals else None)
    return out


def compare(base_P: Sequence[float | None], tuned_P: Sequence[float | None],
            tol: float = 1e-9) -> dict[str, Any]:
    """Average scores, improvement (absolute and % of the baseline) and per-prompt counts.

    Means are over prompts scored on both sides, so both averages describe the same prompts.
    """
    pairs = [(b, t) for b, t in zip(base_P, tuned_P, strict=True)
             if b is not None and t is not None]
    n = len(pairs)
    base = sum(b for b, _ in pairs) / n if n else None
    tuned = sum(t for _, t in pairs) / n if n else None
    delta = None if base is None or tuned is None else tuned - base
    pct = None if delta is None or base is None or abs(base) < tol else 100.0 * delta / abs(base)
    return {
        "prompts": len(base_P),
        "scored_prompts": n,
        "baseline_mean": base,
        "fine_tuned_mean": tuned,
        "improvement": delta,
        "improvement_pct": pct,
        "improved": sum(t - b > tol for b, t in pairs),
        "degraded": sum(b - t > tol for b, t in pairs),
        "equal": sum(abs(t - b) <= tol for b, t in pairs),
        "unscored": len(base_P) - n,
    }


def examples(tasks: Sequence[Any], base: dict, tuned: dict, group_size: int) -> list[dict]:
    """Per-prompt comparison records (first completion's text, per-prompt mean scores)."""
    out = []
    for p, task in enumerate(tasks):
        i = p * group_size
        b, t = base["prompt_scores"][p], tuned["prompt_scores"][p]
        out.append({
            "id": task.id, "prompt": task.prompt, "language": task.language,
            "baseline": {"score": b, "text": base["texts"][i], "reason": base["reasons"][i]},
            "fine_tuned": {"score": t, "text": tuned["texts"][i], "reason": tuned["reasons"][i]},
            "delta": None if b is None or t is None else t - b,
        })
    return out


# --- generation and scoring ---------------------------------------------------------------------


def generate_and_score(label: str, policy: Any, tasks: list, reward_fn: Any, cfg: Any,
                       params: Any, group_size: int, seed: int) -> dict[str, Any]:
    """One model's completions for `tasks`, scored, with its generation speed."""
    import mlx.core as mx

    from ..backends.mlx.rollout import sample
    from ..backends.sampling import prompt_formatter

    mx.random.seed(seed)
    rollouts, stats = sample(policy.model, policy.tokenizer, tasks, params, group_size,
                             prompt_formatter(policy.tokenizer, cfg.model))
    rewards = reward_fn.score([r.task for r in rollouts], [r.text for r in rollouts])
    scores = [r.value for r in rewards]
    return {
        "label": label,
        "texts": [r.text for r in rollouts],
        "scores": scores,
        "reasons": [r.reason for r in rewards],
        "prompt_scores": prompt_means(scores, group_size),
        "tokens": stats.get("gen/tokens", 0.0),
        "seconds": stats.get("gen/seconds", 0.0),
        "tokens_per_sec": stats.get("gen/tokens_per_sec", 0.0),
        "truncated": sum(r.truncated for r in rollouts),
    }


def load_side(path: str, base_override: str | None, cfg: Any, seed: int) -> tuple[Any, str]:
    """(policy, description): a plain model directory or hub id, or base + adapters."""
    from ..artifacts import checkpoint
    from ..artifacts.checkpoint import base_model_of
    from ..backends.mlx.policy import load_policy

    p = Path(path)
    if not p.exists() or (p / "config.json").is_file():
        return load_policy(path, None, None, seed, cfg.model.trust_remote_code), path
    adapter_dir = checkpoint.resolve(p)
    base = base_model_of(adapter_dir, base_override)
    policy = load_policy(base, None, adapter_dir, seed, cfg.model.trust_remote_code)
    return policy, f"{base} + {adapter_dir}"


def build_config(args: argparse.Namespace) -> Any:
    """The strict training config with the command-line flags applied as overrides."""
    from ..config import check, load

    sets = list(args.overrides)
    reward = args.reward or ("teacher" if args.teacher else None)
    if reward:
        sets.append(f"reward.type={reward}")
    if args.teacher:
        sets.append(f"reward.teacher.provider={args.teacher}")
    if args.teacher_model:
        sets.append(f"reward.teacher.model={args.teacher_model}")
    if args.teacher_base_url:
        sets.append(f"reward.teacher.base_url={args.teacher_base_url}")
    if args.max_new_tokens is not None:
        sets.append(f"generation.max_new_tokens={args.max_new_tokens}")
    return check(load(args.config, sets))


def validate(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    from ..backends.sampling import SamplingParams
    from ..data import load_tasks
    from ..rewards.build import build_reward

    if args.max_samples < 0 or args.samples_per_prompt < 1 or args.temperature < 0:
        raise UsageError("-n must be >= 0, --samples-per-prompt >= 1 and --temperature >= 0")
    cfg = build_config(args)
    tasks = load_tasks(args.prompts)
    tasks = tasks[: args.max_samples] if args.max_samples else tasks
    if not tasks:
        raise UsageError(f"{args.prompts} holds no tasks: pass a JSONL file with prompts")
    params = SamplingParams(temperature=args.temperature, top_p=cfg.generation.top_p,
                            top_k=cfg.generation.top_k,
                            max_new_tokens=cfg.generation.max_new_tokens)
    out_dir = Path(args.out).resolve().parent
    reward_fn = build_reward(cfg, out_dir, languages={t.language for t in tasks})
    sides = {}
    try:
        for key, path, override in (("baseline", args.baseline, None),
                                    ("fine_tuned", args.fine_tuned, args.model)):
            with console.status(text(f"{key}: loading {path}")):
                policy, desc = load_side(path, override, cfg, args.seed)
            with console.status(f"{key}: generating and scoring {len(tasks)} prompts"):
                sides[key] = generate_and_score(key, policy, tasks, reward_fn, cfg, params,
                                                args.samples_per_prompt, args.seed)
            sides[key]["model"] = desc
            del policy
        teacher = reward_fn.metrics()
    finally:
        reward_fn.close()
    return report(tasks, sides["baseline"], sides["fine_tuned"], args, cfg, teacher)


def report(tasks: list, base: dict, tuned: dict, args: argparse.Namespace, cfg: Any,
           reward_metrics: dict) -> dict[str, Any]:
    G = args.samples_per_prompt
    summary = compare(base["prompt_scores"], tuned["prompt_scores"])

    def side(s: dict) -> dict:
        scored = [v for v in s["scores"] if v is not None]
        return {"model": s["model"], "mean_score": sum(scored) / len(scored) if scored else None,
                "completions": len(s["scores"]), "unscored_completions": len(s["scores"]) -
                len(scored), "truncated": s["truncated"], "tokens": s["tokens"],
                "seconds": s["seconds"], "tokens_per_sec": s["tokens_per_sec"]}

    return {
        "summary": summary,
        "baseline": side(base),
        "fine_tuned": side(tuned),
        "settings": {"prompts": args.prompts, "reward": cfg.reward.type, "seed": args.seed,
                     "temperature": args.temperature, "samples_per_prompt": G,
                     "max_new_tokens": cfg.generation.max_new_tokens},
        "reward_metrics": reward_metrics,
        "examples": examples(tasks, base, tuned, G),
    }


# --- output -------------------------------------------------------------------------------------


def write_json(path: Path, data: dict) -> None:
    from ..artifacts.atomic import write_text_atomic

    write_text_atomic(path, json.dumps(data, indent=2, allow_nan=False, default=_no_nan) + "\n")


def _no_nan(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)


def _fmt(v: float | None, sign: bool = False) -> str:
    return "n/a" if v is None else (f"{v:+.4f}" if sign else f"{v:.4f}")


def print_report(rep: dict, console: Any, show: int, chars: int) -> None:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    from ..terminal import visible

    s, b, t = rep["summary"], rep["baseline"], rep["fine_tuned"]
    table = Table(title=f"Validation: baseline vs fine-tuned ({s['prompts']} prompts, reward "
                        f"{rep['settings']['reward']})")
    table.add_column("")
    table.add_column("baseline", justify="right")
    table.add_column("fine-tuned", justify="right")
    table.add_row("mean score (prompts scored on both)", _fmt(s["baseline_mean"]),
                  _fmt(s["fine_tuned_mean"]))
    table.add_row("generation tokens/s", f"{b['tokens_per_sec']:.1f}", f"{t['tokens_per_sec']:.1f}")
    table.add_row("truncated completions", str(b["truncated"]), str(t["truncated"]))
    console.print(table)
    pct = "" if s["improvement_pct"] is None else f" ({s['improvement_pct']:+.2f}%)"
    console.print(f"improvement: {_fmt(s['improvement'], sign=True)}{pct}   improved "
                  f"{s['improved']}, degraded {s['degraded']}, equal {s['equal']}, "
                  f"unscored {s['unscored']}")
    for ex in rep["examples"][:show]:  # untrusted text: no markup, control characters escaped
        body = Text()
        body.append("prompt: ", "bold").append(visible(ex["prompt"][:chars]) + "\n\n")
        for key, name in (("baseline", "baseline"), ("fine_tuned", "fine-tuned")):
            body.append(f"{name} ({_fmt(ex[key]['score'])}):\n", "bold")
            body.append(visible(ex[key]["text"][:chars]) + "\n\n")
        title = f"{visible(ex['id'], lines=False)}  delta {_fmt(ex['delta'], sign=True)}"
        console.print(Panel(body, title=Text(title)))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    rep = validate(args, Console(stderr=True))
    out = Path(args.out)
    write_json(out, rep)
    print_report(rep, console, args.show, args.print_chars)
    console.print(text(f"report written to {out}"))
    return 0
