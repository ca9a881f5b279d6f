"""The trainer's objective against the numpy reference (tests/reference_objective.py), for every
row of an all-pairs covering array over the options that change a step's math: advantage
estimator, ratio level, loss aggregation, loss kind, KL placement and estimator, reference kind,
ratio 1 or not (num_iterations > 1), entropy bonus, feedback-masked conversations, clip range,
backend. On random batches with unequal lengths, the trainer's path (train/step.py's targets:
advantages, GAE, the reward's KL; algo/aggregation.py's weights as the backends resolve them;
backends/batch.py's padded layout; algo/objective.py in MLX, or in torch for the torch rows)
gives the reference's loss, its gradient with respect to the token log-probs, the entropies and
the values, the reported KL and the clip count. A pair the config check refuses is tested as a
refusal: ConfigError, one line naming both options.

Not covered: the model's log-probs themselves (tests/test_policy.py, test_shared_prompt.py,
test_chunked_loss.py), training steps (the pairwise training matrix).
"""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
import reference_objective as ref
from covering import covering_rows

from mlx_rlaif.algo.aggregation import aggregation_weights, loss_aggregation
from mlx_rlaif.algo.objective import objective
from mlx_rlaif.backends.batch import build
from mlx_rlaif.config import batch_sequences, check, load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.records import Rollout, Task
from mlx_rlaif.train.step import critic_targets, group_targets

FACTORS = {
    "advantage": ["grpo", "rloo", "reinforce", "gae"],
    "ratio_level": ["token", "sequence"],
    "loss_agg": ["auto", "token", "sequence", "constant"],
    "loss": ["ppo", "cispo"],
    "kl": ["off", "loss", "reward"],
    "kl_estimator": ["k1", "k2", "k3"],
    "reference": ["base", "ema", "periodic"],
    "off_policy": [False, True],
    "entropy_coef": [0.0, 0.01],
    "turns": [1, 2],
    "clip": ["default", "explicit"],
    "backend": ["mlx", "torch"],
}
# the torch backend's own limits (config.check), not the objective's
TORCH_ONLY_WITHOUT = {("advantage", "gae"), ("reference", "ema"), ("reference", "periodic"),
                      ("turns", 2)}
# pairs config.check refuses for what they would not do (docs/combinations.md), not the math's
CONFIG_REFUSED = {frozenset({("reference", "ema"), ("kl", "off")}),
                  frozenset({("reference", "periodic"), ("kl", "off")})}
P, G, MAX_NEW, BASELINE = 2, 3, 8, 0.3
TOL = {"rtol": 1e-4, "atol": 1e-6}


def options(row: dict) -> ref.Options:
    return ref.Options(advantage=row["advantage"], ratio_level=row["ratio_level"],
                       loss_agg=row["loss_agg"], loss=row["loss"], kl=row["kl"],
                       kl_estimator=row["kl_estimator"], kl_penalty=0.1,
                       clip=(0.1, 0.15) if row["clip"] == "explicit" else None,
                       entropy_coef=row["entropy_coef"], max_new_tokens=MAX_NEW,
                       batch_sequences=P * G, reinforce_baseline=BASELINE)


def refused(pair: tuple) -> bool:
    a, x, b, y = pair
    row = {"advantage": "grpo", "ratio_level": "token", "loss_agg": "auto", "kl": "off",
           "kl_estimator": "k2", a: x, b: y}
    base = ref.Options(**{k: row[k] for k in ("advantage", "ratio_level", "loss_agg", "kl",
                                              "kl_estimator")})
    if ref.refusal(base) or frozenset({(a, x), (b, y)}) in CONFIG_REFUSED:
        return True
    return ("backend", "torch") in ((a, x), (b, y)) and bool(
        {(a, x), (b, y)} & TORCH_ONLY_WITHOUT)


ROWS, REFUSED = covering_rows(FACTORS, refused)


def overrides(row: dict) -> list[str]:
    out = [f"rl.advantage={row['advantage']}",
           f"rl.scale={'batch' if row['advantage'] == 'reinforce' else 'group'}",
           f"rl.ratio_level={row['ratio_level']}", f"rl.loss={row['loss']}",
           f"rl.kl_penalty={0.0 if row['kl'] == 'off' else 0.1}",
           f"rl.kl_in_reward={str(row['kl'] == 'reward').lower()}",
           f"rl.kl_estimator={row['kl_estimator']}", f"rl.reference={row['reference']}",
           f"rl.num_iterations={2 if row['off_policy'] else 1}",
           f"rl.entropy_coef={row['entropy_coef']}", f"generation.max_turns={row['turns']}",
           f"model.backend={row['backend']}", f"generation.num_samples_per_prompt={G}",
           f"training.batch_size={P}", f"generation.max_new_tokens={MAX_NEW}"]
    if row["loss_agg"] != "auto":  # auto: the default, left unset
        out.append(f"rl.loss_agg={row['loss_agg']}")
    if row["clip"] == "explicit":
        out += ["rl.clip_low=0.1", "rl.clip_high=0.15"]
    return out


def f32(x: np.ndarray) -> np.ndarray:
    """The float32 value both sides see (the trainer's arrays are float32)."""
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def random_batch(row: dict, seed: int) -> list[ref.Seq]:
    """P groups of G sequences of unequal lengths; with two turns, conversations whose
    feedback tokens (mask 0) sit between two answers. Off-policy: log-ratios around the clip
    range, so some clip and some do not."""
    rng = np.random.default_rng(seed)
    c = max(ref.clip_range(options(row)))
    seqs = []
    for i in range(P * G):
        answers = [int(rng.integers(1, 7))]
        if row["turns"] == 2 and (i == 0 or rng.random() < 0.6):
            answers.append(int(rng.integers(1, 7)))
        mask = np.ones(answers[0])
        if len(answers) == 2:
            mask = np.concatenate([mask, np.zeros(int(rng.integers(1, 6))), np.ones(answers[1])])
        n, fb = len(mask), mask == 0
        old = f32(np.where(fb, 0.0, rng.normal(-1.5, 0.5, n)))  # the sampler's: 0 on feedback
        shift = c * (rng.uniform(-1.5, 1.5) + rng.normal(0, 1, n)) if row["off_policy"] else 0
        logp = f32(np.where(fb, rng.normal(-2, 1, n), old + shift))
        score = float(f32(rng.uniform()))
        reference = f32(np.where(fb, rng.normal(-2, 1, n), old + rng.normal(0, 0.3, n)))
        seqs.append(ref.Seq(group=i // G, score=score, old=old, logp=logp, ref=reference,
                            mask=mask, entropy=f32(rng.uniform(0.5, 3.0, n)),
                            old_values=f32(rng.uniform(0, 1, n)), values=np.zeros(n)))
        seqs[-1].values = f32(seqs[-1].old_values + rng.normal(0, 0.3, n))
    return seqs


def rollout(s: ref.Seq, i: int) -> Rollout:
    n = len(s.mask)
    return Rollout(Task(f"t{s.group}", "p"), tuple(range(3, 3 + 2 + i % 3)),
                   tuple(range(20, 20 + n)), tuple(s.old.tolist()), "x", "stop", 1.0,
                   tuple(int(m) for m in s.mask) if (s.mask == 0).any() else None)


def trainer_batch(cfg, seqs: list[ref.Seq]) -> tuple[dict, dict, list[Rollout]]:
    """The step's targets (train/step.py, through a stand-in run whose reference and critic
    return the batch's arrays), the weights as the backends resolve them, and the padded
    micro-batch (with the current log-probs, entropies and values in the same layout)."""
    rollouts = [rollout(s, i) for i, s in enumerate(seqs)]
    by_id = {id(r): s for r, s in zip(rollouts, seqs, strict=True)}
    ops = SimpleNamespace(reference=lambda p, rs, c: [by_id[id(r)].ref for r in rs],
                          values=lambda p, rs, c, mean: [by_id[id(r)].old_values for r in rs])
    run = SimpleNamespace(cfg=cfg, ops=ops, policy=None, world=SimpleNamespace(reduce=None),
                          state=SimpleNamespace(reinforce_baseline=BASELINE))
    targets = (critic_targets if cfg.rl.advantage == "gae" else group_targets)(
        run, rollouts, [s.score for s in seqs], cfg.rl.kl_penalty)
    assert targets.keep == list(range(len(seqs)))
    w = aggregation_weights([r.trained_tokens for r in rollouts], loss_aggregation(cfg.rl),
                            cfg.generation.max_new_tokens, batch_sequences(cfg))
    current = {"logp": [s.logp for s in seqs], "entropy": [s.entropy for s in seqs],
               "values": [s.values for s in seqs]}
    mb = build(rollouts, targets.adv, w, targets.ref, fields={**(targets.critic or {}),
                                                                **current})
    return mb, targets.kl, rollouts


def mlx_objective(cfg, mb: dict) -> tuple[float, dict, list[np.ndarray]]:
    inputs = [mx.array(mb.pop(k)) for k in ("logp", "entropy", "values")]
    arrays = {k: mx.array(v) for k, v in mb.items()}
    gae = cfg.rl.advantage == "gae"

    def loss(lp, h, v):
        return objective(lp, h, arrays, cfg.rl, cfg.rl.kl_penalty, values=v if gae else None)

    (total, aux), grads = mx.value_and_grad(loss, argnums=(0, 1, 2))(*inputs)
    return total.item(), {k: v.item() for k, v in aux.items()}, [np.array(g) for g in grads]


def torch_objective(cfg, mb: dict) -> tuple[float, dict, list[np.ndarray]]:
    torch = pytest.importorskip("torch")
    inputs = [torch.tensor(mb.pop(k), requires_grad=True) for k in ("logp", "entropy")]
    arrays = {k: torch.from_numpy(v) for k, v in mb.items() if k not in ("values",)}
    total, aux = objective(*inputs, arrays, cfg.rl, cfg.rl.kl_penalty, xp=torch)
    total.backward()
    grads = [x.grad.numpy() for x in inputs]
    return float(total.detach()), {k: float(v.detach()) for k, v in aux.items()}, grads + [
        np.zeros_like(grads[0])]


def per_sequence(padded: np.ndarray, rollouts: list[Rollout]) -> list[np.ndarray]:
    """Each rollout's completion positions cut out of a padded [N, T] array; every other
    position must be 0 (padding and prompt get no gradient)."""
    out, rest = [], padded.copy()
    for i, r in enumerate(rollouts):
        start = len(r.prompt_tokens) - 1
        out.append(padded[i, start: start + len(r.tokens)])
        rest[i, start: start + len(r.tokens)] = 0
    assert not rest.any()
    return out


def test_the_array_covers_every_allowed_pair_and_refuses_the_rest():
    from covering import pairs_of

    covered = set().union(*(pairs_of(r) for r in ROWS))
    names = sorted(FACTORS)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for x in FACTORS[a]:
                for y in FACTORS[b]:
                    assert ((a, x, b, y) in covered) != ((a, x, b, y) in REFUSED)
    assert len(ROWS) <= 30  # a covering array, not the product (27,648 rows)


@pytest.mark.parametrize("seed, row", enumerate(ROWS), ids=[f"row{i}" for i in range(len(ROWS))])
def test_trainer_matches_the_reference(seed, row):
    cfg = check(load(None, overrides(row)))
    seqs = random_batch(row, seed)
    want = ref.objective(seqs, options(row))
    mb, kl, rollouts = trainer_batch(cfg, seqs)
    loss, aux, grads = (torch_objective if row["backend"] == "torch" else mlx_objective)(cfg, mb)
    assert loss == pytest.approx(want.loss, rel=TOL["rtol"], abs=TOL["atol"])
    for got, expected in zip(grads, (want.d_logp, want.d_entropy, want.d_values), strict=True):
        for g, e in zip(per_sequence(got, rollouts), expected, strict=True):
            np.testing.assert_allclose(g, e, **TOL)
    assert aux["clipped"] == want.clipped
    reported = kl.get("kl/mean", aux["kl"] / aux["tokens"] if "kl" in aux else None)
    assert (reported is None) == (want.kl_mean is None)
    if reported is not None:
        assert reported == pytest.approx(want.kl_mean, rel=TOL["rtol"], abs=TOL["atol"])


NEUTRAL = {name: values[0] for name, values in FACTORS.items()} | {"kl_estimator": "k2"}
KEYS = {"advantage": "rl.advantage", "ratio_level": "rl.ratio_level", "loss_agg": "rl.loss_agg",
        "kl": "rl.kl_", "kl_estimator": "rl.kl_estimator", "reference": "rl.reference",
        "turns": "generation.max_turns", "backend": "torch"}


@pytest.mark.parametrize("pair", REFUSED, ids=[f"{a}={x}-{b}={y}" for a, x, b, y in REFUSED])
def test_a_refused_pair_is_one_line_naming_both_options(pair):
    a, x, b, y = pair
    row = {**NEUTRAL, a: x, b: y}
    with pytest.raises(ConfigError) as e:
        check(load(None, overrides(row)))
    text = str(e.value)
    assert "\n" not in text and KEYS[a] in text and KEYS[b] in text, text


def test_refused_pairs_are_the_documented_ones():
    """The list docs/algorithms.md and the config docs give (and the pairwise matrix uses)."""
    objective_pairs = {(a, x, b, y) for a, x, b, y in REFUSED if "backend" not in (a, b)}
    assert objective_pairs == {("kl", "loss", "kl_estimator", "k1"),
                               ("kl", "off", "reference", "ema"),
                               ("kl", "off", "reference", "periodic"),
                               ("loss_agg", "constant", "ratio_level", "sequence"),
                               ("loss_agg", "token", "ratio_level", "sequence")}
