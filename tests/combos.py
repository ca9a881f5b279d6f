"""The options that change a step, as factors of a pairwise covering array (every pair of two
factors' levels in at least one row), the refusals read from `config.check`, and the invariants
a row's metrics must hold. Used by tests/test_combinations.py.

A row is a full assignment (every factor set explicitly). `covering_array` builds rows greedily
and deterministically (AETG without randomness: a row starts from the first uncovered pair,
each further factor takes the level that covers the most uncovered pairs); a row that
`config.check` refuses teaches a refused pair, read from the one-line message, which must name
both options by their dotted keys (`refused_pair`), and the row is built again without it. So
the array adapts to whatever `check` refuses: nothing here lists the refusals.

Not covered: combinations of three or more options (a refusal must be a pair's), options
outside FACTORS (fixed in BASE).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlx_rlaif.config import batch_sequences, check, load
from mlx_rlaif.errors import ConfigError

# where a row's overrides name the adapters a run starts from (rl.reference initial): the caller
# puts a real adapter directory in its place (`with_adapters`)
INIT_ADAPTER = "@init-adapter"

# a shipped reward function (examples/rewards/), by its absolute path
FORMAT_REWARD = f"{Path(__file__).resolve().parent.parent}/examples/rewards/format_reward.py:one_fence"

# factor -> level -> overrides; the first level of each is the one a row prefers on a tie
FACTORS: dict[str, dict[str, tuple[str, ...]]] = {
    "rl.advantage": {k: (f"rl.advantage={k}",) for k in ("grpo", "rloo", "reinforce", "gae")},
    "rl.ratio_level": {k: (f"rl.ratio_level={k}",) for k in ("token", "sequence")},
    "rl.loss_agg": {"default": (), **{k: (f"rl.loss_agg={k}",)
                                      for k in ("token", "sequence", "constant")}},
    "rl.loss": {k: (f"rl.loss={k}",) for k in ("ppo", "cispo")},
    "KL": {"loss": ("rl.kl_penalty=0.5", "rl.kl_in_reward=false"),
           "reward": ("rl.kl_penalty=0.5", "rl.kl_in_reward=true"),
           "off": ("rl.kl_penalty=0",)},
    "rl.kl_estimator": {k: (f"rl.kl_estimator={k}",) for k in ("k2", "k3", "k1")},
    "rl.reference": {"base": ("rl.reference=base",), "ema": ("rl.reference=ema",),
                     "periodic": ("rl.reference=periodic", "rl.ref_update_every=1"),
                     "initial": ("rl.reference=initial", f"lora.init_adapter={INIT_ADAPTER}")},
    "rl.adaptive_kl": {k: (f"rl.adaptive_kl={k}",) for k in ("false", "true")},
    "rl.dynamic_sampling": {k: (f"rl.dynamic_sampling={k}",) for k in ("false", "true")},
    "rl.guidance": {k: (f"rl.guidance={k}",) for k in ("false", "true")},
    # null: one step's updates; 0: carried groups never used; 4: up to two steps old at
    # num_iterations 2 (values between 0 and num_iterations are refused with dynamic sampling:
    # tests/test_dynamic_limits.py)
    "rl.carry_max_age": {"default": (), "0": ("rl.carry_max_age=0",),
                         "4": ("rl.carry_max_age=4",)},
    "data.curriculum": {k: (f"data.curriculum={k}",) for k in ("false", "true")},
    "generation.max_turns": {k: (f"generation.max_turns={k}",) for k in ("1", "2")},
    "generation.speculative": {"off": (), "ngram": ("generation.speculative=ngram",
                                                    "generation.draft_tokens=3")},
    "rl.num_iterations": {k: (f"rl.num_iterations={k}",) for k in ("1", "2")},
    "rl.mask_truncated": {k: (f"rl.mask_truncated={k}",) for k in ("false", "true")},
    "rl.scale": {k: (f"rl.scale={k}",) for k in ("batch", "group", "none")},
    "model.backend": {k: (f"model.backend={k}",) for k in ("mlx", "torch")},
    "training.gradient_accumulation_steps": {
        k: (f"training.gradient_accumulation_steps={k}",) for k in ("1", "2")},
    "generation.num_samples_per_prompt": {
        k: (f"generation.num_samples_per_prompt={k}",) for k in ("2", "1")},
    "model dtype": {"float32": (), "bfloat16": ()},  # the model path: set by the caller
    "reward.exec.cache_size": {"4096": (), "0": ("reward.exec.cache_size=0",)},
    # the reward as components: exec at 0.7 and a user's function (a worker process) at 0.3
    "reward.exec.hack_penalty": {"0": (), "0.5": ("reward.exec.hack_penalty=0.5",)},
    "reward.components": {"exec": (), "exec+function": (
        f"reward.components=[{{kind: exec, weight: 0.7}}, {{kind: function, weight: 0.3, "
        f"fn: '{FORMAT_REWARD}'}}]",)},
    # a target for every token: the shipped tiny model as the teacher (its tokenizer is the
    # student's), or the student with its exec feedback in context
    "distill.kind": {"off": (), "teacher": ("distill.kind=teacher",
                                            "distill.teacher=builtin:tiny-coder"),
                     "self": ("distill.kind=self",)},
}

# the dotted keys by which a refusal names each factor
NAMES: dict[str, tuple[str, ...]] = {
    **{f: (f,) for f in FACTORS if "." in f},
    "KL": ("rl.kl_penalty", "rl.kl_in_reward"),
    "model dtype": ("model.path",),
}

# every row: the shipped tiny model on the easy Python tasks (rewards that vary), exec reward,
# 2 prompts, 2 steps, short completions, everything the invariants need measured
BASE = ("data.train_file=suite:synthetic-train", "data.languages=[python]",
        "data.difficulties=[easy]", "data.eval_file=", "reward.type=exec",
        "training.batch_size=2", "training.max_steps=2", "generation.max_new_tokens=16",
        "logging.tensorboard=false", "logging.baseline_eval_batches=0",
        "logging.collect_dataset=false", "training.save_every_epochs=0",
        "rl.drop_zero_std=false", "rl.entropy_coef=0.01", "rl.kl_horizon=10",
        "rl.max_extra_rounds=4", "rl.oversample=2", "generation.feedback_chars=80",
        "training.learning_rate=0.01")

Pair = tuple[tuple[str, str], tuple[str, str]]  # ((factor, level), (factor, level)), sorted


def overrides(row: dict[str, str]) -> list[str]:
    return [*BASE, *(o for f, level in row.items() for o in FACTORS[f][level])]


def with_adapters(sets: list[str], adapter_dir: str) -> list[str]:
    """`sets` with INIT_ADAPTER replaced by `adapter_dir`."""
    return [s.replace(INIT_ADAPTER, adapter_dir) for s in sets]


def refusal(row: dict[str, str]) -> str | None:
    """`config.check`'s message for the row, or None where it is accepted."""
    try:
        check(load(None, overrides(row)))
    except ConfigError as e:
        return str(e)
    return None


def named(message: str) -> list[str]:
    """The factors a message names by their dotted keys (rl.loss, not rl.loss_agg)."""
    return [f for f, keys in NAMES.items()
            if any(re.search(re.escape(k) + r"(?![\w])", message) for k in keys)]


def refused_pair(row: dict[str, str], message: str, known: Sequence[Pair] = ()) -> Pair:
    """The pair of the row that `message` refuses: the two factors it names; of three or more,
    the two not `known` that stay refused together (a message naming both) whatever levels the
    other named factors take. AssertionError where the message is not one line naming two
    factors by their keys, or no named pair is refused whatever the others."""
    names = named(message)
    assert "\n" not in message, f"a refusal is one line: {message!r}"
    assert len(names) >= 2, f"a refusal must name both options by their keys: {message!r}"
    if len(names) == 2:
        return pair((names[0], row[names[0]]), (names[1], row[names[1]]))
    for a, b in itertools.combinations(names, 2):
        if pair((a, row[a]), (b, row[b])) in known:
            continue
        others = [f for f in names if f not in (a, b)]
        variants = [dict(zip(others, levels, strict=True))
                    for levels in itertools.product(*(FACTORS[f] for f in others))]
        if all({a, b} <= set(named(refusal({**row, **v}) or "")) for v in variants):
            return pair((a, row[a]), (b, row[b]))
    raise AssertionError(f"no pair of {names} is refused whatever the others: {message!r}")


def pair(x: tuple[str, str], y: tuple[str, str]) -> Pair:
    order = list(FACTORS)
    return (x, y) if order.index(x[0]) < order.index(y[0]) else (y, x)


def all_pairs() -> list[Pair]:
    out = []
    for a, b in itertools.combinations(FACTORS, 2):
        out += [((a, x), (b, y)) for x in FACTORS[a] for y in FACTORS[b]]
    return out


def covering_array(is_refused: Callable[[dict[str, str]], str | None] = refusal
                   ) -> tuple[list[dict[str, str]], dict[Pair, str]]:
    """(rows every accepted pair is in, the refused pairs with their messages)."""
    order = {p: i for i, p in enumerate(all_pairs())}
    uncovered = set(order)
    refused: dict[Pair, str] = {}
    rows: list[dict[str, str]] = []
    while uncovered:
        first = min(uncovered, key=order.__getitem__)
        row = build_row(first, uncovered, refused)
        message = is_refused(row)
        if message is not None:
            bad = refused_pair(row, message, list(refused))
            assert bad not in refused, (
                f"{first} combines with no level of some factor, each refused for another "
                f"reason ({message}): add a refusal naming both of {first}")
            refused[bad] = message
            uncovered.discard(bad)
            continue
        rows.append(row)
        uncovered -= set(pairs_of(row))
    return rows, refused


def build_row(start: Pair, uncovered: set[Pair], refused: dict[Pair, str]) -> dict[str, str]:
    (a, x), (b, y) = start
    row = {a: x, b: y}
    for f, levels in FACTORS.items():
        if f in row:
            continue
        allowed = [level for level in levels
                   if not any(pair((f, level), (g, v)) in refused for g, v in row.items())]
        allowed = allowed or list(levels)  # none: check() refuses the row, naming a new pair
        row[f] = max(allowed, key=lambda level: sum(
            pair((f, level), (g, v)) in uncovered for g, v in row.items()))
    return {f: row[f] for f in FACTORS}


def pairs_of(row: dict[str, str]) -> list[Pair]:
    return [((a, row[a]), (b, row[b])) for a, b in itertools.combinations(FACTORS, 2)]


def label(p: Pair) -> tuple[str, str]:
    """How docs/combinations.md writes a pair: `factor: level` twice."""
    return tuple(f"`{f}: {level}`" for f, level in p)  # type: ignore[return-value]


# --- the invariants of a row's two steps -------------------------------------------------------


def effective_agg(cfg: Any) -> str:
    """The loss aggregation a config trains with (`auto`, where it exists: sequence with
    sequence-level ratios, else token)."""
    agg = cfg.rl.loss_agg
    if agg == "auto":
        return "sequence" if cfg.rl.ratio_level == "sequence" else "token"
    return agg


F32_UNIT_ROUNDOFF = 2.0 ** -24


def sum_tolerance(terms: float, size: float) -> float:
    """How far two float32 sums of the same `terms` per-token values, grouped differently
    (loss/total sums each token's policy + KL - entropy terms, then the tokens; the parts sum
    each term over the tokens, then add), may differ: Higham's bound for recursive summation,
    (n - 1) u sum |x| plus each token's own three, with n the terms, u float32's unit roundoff and sum |x| taken as the
    loss's size (its KL and policy terms dominate it). The per-token terms are float32 in both
    dtypes (the log-probs are upcast before the objective), so bfloat16 rows need no other
    bound; what grows the gap is a large loss (k3's exp(ref - logp) reaches 1e7 a token once a
    row's lr=0.01 run diverges), not the model's dtype."""
    return (terms + 2.0) * F32_UNIT_ROUNDOFF * (1.0 + size) + 1e-7


def weight_sum(cfg: Any, m: dict[str, float]) -> float:
    """The sum of the loss's per-token weights over a step's tokens (algo/aggregation.py),
    which bounds its entropy term by entropy_coef log V times it: 1 for the per-sequence mean;
    for Dr. GRPO's constant divisor, tokens / (max_new_tokens x the configured batch's
    sequences), over 1 where multi-turn sequences hold more than max_new_tokens trained
    tokens (turn 2's completion too)."""
    if effective_agg(cfg) != "constant":
        return 1.0
    return max(1.0, m["train/tokens"] / (cfg.generation.max_new_tokens * batch_sequences(cfg)))


def violations(row: dict[str, str], cfg: Any, steps: Sequence[dict[str, float]], vocab: int
               ) -> list[str]:
    """What in the metrics of the steps of `row` (trained with `cfg`) breaks an invariant
    (empty: none)."""
    out: list[str] = []
    value_coef, entropy_coef, P = cfg.rl.value_coef, cfg.rl.entropy_coef, cfg.training.batch_size
    G = int(row["generation.num_samples_per_prompt"])
    for n, m in enumerate(steps, 1):
        def bad(what: str, n: int = n) -> None:
            out.append(f"step {n}: {what}")

        for k, v in m.items():
            if isinstance(v, float) and not math.isfinite(v):
                bad(f"{k} = {v}")
        if not m.get("train/sequences", 0) > 0:
            every_one_cut = row["rl.mask_truncated"] == "true" and m["gen/truncated_frac"] == 1
            no_signal = row["rl.dynamic_sampling"] == "true" and m["sample/groups_kept"] == 0
            if not (every_one_cut or no_signal):  # else mask_truncated left every completion
                bad(f"train/sequences = {m.get('train/sequences')}")  # out, or no group varied
            continue
        if not 0.0 <= m["reward/min"] <= m["reward/mean"] <= m["reward/max"] <= 1.0:
            bad(f"rewards out of [0, 1]: {m['reward/min']}, {m['reward/mean']}, "
                f"{m['reward/max']}")
        if m.get("optim/skipped", 0) != 0:
            bad(f"optim/skipped = {m['optim/skipped']}")
        if not 0.0 <= m["policy/clipfrac"] <= 1.0:
            bad(f"policy/clipfrac = {m['policy/clipfrac']}")
        parts = m["loss/policy"] + m.get("loss/kl", 0.0) + value_coef * m.get("loss/value", 0.0)
        gap = parts - m["loss/total"]
        tol = sum_tolerance(m["train/tokens"] * cfg.rl.num_iterations, abs(parts))
        if effective_agg(cfg) == "token":  # weights 1/tokens: the entropy term is its mean
            if abs(gap - entropy_coef * m["policy/entropy"]) > tol:
                bad(f"loss/total {m['loss/total']} != loss/policy + loss/kl + value term - "
                    f"entropy term ({parts} - {entropy_coef * m['policy/entropy']})")
        elif not -tol <= gap <= entropy_coef * math.log(vocab) * weight_sum(cfg, m) + tol:
            bad(f"loss/total {m['loss/total']} vs loss/policy + loss/kl + value term {parts}: "
                f"the entropy term {gap} is outside [0, entropy_coef log V sum(w)]")
        kl = row["KL"]
        if (kl == "loss") != ("loss/kl" in m):
            bad(f"KL {kl} but loss/kl {'present' if 'loss/kl' in m else 'absent'}")
        if (kl == "off") == ("kl/mean" in m):
            bad(f"KL {kl} but kl/mean {'present' if 'kl/mean' in m else 'absent'}")
        if (row["rl.advantage"] == "gae") != ("loss/value" in m):
            bad("loss/value where there is no critic, or none with one")
        if (row["rl.guidance"] == "true") != ("sample/guided" in m):
            bad("sample/guided where guidance is off, or none with it on")
        if row["rl.dynamic_sampling"] == "true":
            kept = m["sample/groups_kept"]
            accum = int(row["training.gradient_accumulation_steps"])
            full = m["train/sequences"] == G * kept
            if not 0 < kept <= P * accum or not (full or row["rl.mask_truncated"] == "true"):
                bad(f"sample/groups_kept {kept} with train/sequences {m['train/sequences']}")
        elif row["rl.mask_truncated"] == "false" and row["rl.advantage"] != "gae":
            total = P * int(row["training.gradient_accumulation_steps"]) * G
            if m["train/sequences"] != total:
                bad(f"train/sequences {m['train/sequences']} != P x G = {total}")
        distill = row.get("distill.kind", "off")
        keys = {k for k in m if k.startswith("distill/")}
        want = {"off": set(), "teacher": {"distill/kl", "distill/kl_p90", "distill/seconds"},
                "self": {"distill/frac_context", "distill/seconds"}}[distill]
        if not want <= keys or (distill == "off" and keys):
            bad(f"distill.kind {distill} but the metrics {sorted(keys)}")
    adaptive = row["rl.adaptive_kl"] == "true" and row["KL"] != "off" and len(steps) == 2
    if adaptive and steps[0]["kl/penalty"] == steps[1]["kl/penalty"]:
        out.append("the adaptive controller left kl/penalty where it was")
    return out
