"""A reference RL objective in numpy: the oracle tests/test_reference_objective.py holds the
trainer to. Written from the papers' formulas and TRL's / verl's documented semantics, not from
mlx_rlaif's code (it imports none of it): per sequence, ragged (no padding), float64, loops
where the formula is a sum, and every gradient differentiated by hand from the formula.

What it computes, for one rollout batch (every sequence kept, every reward scored):
- advantages: GRPO (r - mean_group) / std_group; RLOO (r - mean of the others), / std_group;
  REINFORCE++ (r - b) / std_batch; GAE (Schulman et al. 2016) over the student's tokens only:
  a conversation's feedback tokens are the environment's, no time step (verl's multi-turn
  response mask), the score on the last student token, the advantages whitened over every
  student token of the batch. Population stds.
- KL (Schulman's estimators, r = ref / pi): k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 -
  log r. In the loss: kl_penalty * k on every student token (its gradient through log pi). In
  the reward (InstructGPT, TRL's default): score - kl_penalty * sum_t k1_t of the sampler's
  log-probs, or per token with GAE. The reported KL is k1's mean over the student's tokens.
- the policy term, per student token t of sequence i, A its advantage (sequence or token):
    PPO (Schulman et al. 2017; DAPO's clip-higher): max(-A r_t, -A clip(r_t, 1-lo, 1+hi)),
        r_t = pi_t / old_t;
    GSPO (Zheng et al. 2025), in its token form: s_it = sg(s_i) pi_t / sg(pi_t), s_i =
        exp(mean_t log(pi_t / old_t)): the value s_i, the gradient s_i d log pi_t; clip range
        3e-4 / 4e-4 unless given, and each sequence counted once (1/G);
    CISPO (MiniMax-M1 2025): -sg(clip(r)) A log pi_t.
- entropy bonus -c H_t; PPO2's clipped value loss 0.5 max((V - R)^2, (V_old + clip(V - V_old,
  +-c) - R)^2), times value_coef.
- the aggregation (verl's loss_agg_mode): token-mean (DAPO: 1 / all student tokens),
  seq-mean-token-mean (GRPO, GSPO: 1 / (N |y_i|)), seq-mean-token-sum-norm (Dr. GRPO: 1 /
  (max_new_tokens x the configured batch's sequences)).
- on-policy distillation (GKD's reverse KL as a reward; Thinking Machines 2025; SDPO's
  self-distillation): per student token d_t = coef (log p_target - log old), old the
  sampler's, clipped to +-clip where clip > 0, and the token's advantage weight_reward A + d_t
  (A the sequence's or, with GAE, the token's). The reported distillation KL is the mean of
  log old - log p_target over the student's tokens.
- the combinations whose meaning would contradict the options' names (`refusal`).

Not covered: zero-variance groups, unscorable rewards, truncation masks, several ranks: the
trainer's own tests cover those.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

GSPO_CLIP = (3e-4, 4e-4)
PPO_CLIP = (0.2, 0.28)


@dataclass(frozen=True)
class Options:
    advantage: str = "grpo"  # grpo | rloo | reinforce | gae
    ratio_level: str = "token"  # token | sequence
    loss_agg: str = "auto"  # auto | token | sequence | constant
    loss: str = "ppo"  # ppo | cispo
    kl: str = "off"  # off | loss | reward
    kl_estimator: str = "k2"
    kl_penalty: float = 0.1
    clip: tuple[float, float] | None = None  # None: by ratio level
    entropy_coef: float = 0.0
    gamma: float = 1.0
    lam: float = 0.95
    value_coef: float = 0.5
    value_clip: float = 0.2
    max_new_tokens: int = 8
    batch_sequences: int = 0  # the configured batch's sequence count (Dr. GRPO's divisor)
    reinforce_baseline: float = 0.0
    distill_coef: float = 0.0  # 0: no distillation term
    distill_clip: float = 0.0  # 0: not clipped
    weight_reward: float = 1.0


@dataclass
class Seq:
    """One sequence: per-token arrays over its completion (feedback tokens included, mask 0)."""

    group: int
    score: float
    old: np.ndarray  # the sampler's log-probs (0 on feedback tokens)
    logp: np.ndarray  # the current policy's
    ref: np.ndarray
    mask: np.ndarray  # 1: the student's token, 0: feedback
    entropy: np.ndarray
    old_values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    teacher: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the target's log-probs


@dataclass
class Result:
    loss: float
    d_logp: list[np.ndarray]
    d_entropy: list[np.ndarray]
    d_values: list[np.ndarray]
    kl_mean: float | None  # the reported KL (None: no KL)
    clipped: float  # student tokens where the clip was active


def refusal(o: Options) -> str | None:
    """Why a combination contradicts what its options name (None: it does not)."""
    if o.ratio_level == "sequence" and o.loss_agg in ("token", "constant"):
        return "GSPO counts each sequence once (1/G); this aggregation weighs it by its length"
    if o.kl == "loss" and o.kl_estimator == "k1":
        return "k1's gradient is zero in expectation: the KL penalty would do nothing"
    return None


def aggregation(o: Options) -> str:
    if o.loss_agg != "auto":
        return o.loss_agg
    return "sequence" if o.ratio_level == "sequence" else "token"


def clip_range(o: Options) -> tuple[float, float]:
    if o.clip is not None:
        return o.clip
    return GSPO_CLIP if o.ratio_level == "sequence" else PPO_CLIP


def student(x: np.ndarray, s: Seq) -> np.ndarray:
    return x[s.mask == 1]


def k1_sampled(s: Seq) -> np.ndarray:
    """k1 of the student's tokens, from the sampler's log-probs (the reward's KL)."""
    return student(s.old - s.ref, s)


def sequence_advantages(seqs: list[Seq], o: Options) -> np.ndarray:
    """One advantage per sequence from its (KL-shaped) reward."""
    r = np.array([s.score for s in seqs])
    if o.kl == "reward":
        r = r - o.kl_penalty * np.array([k1_sampled(s).sum() for s in seqs])
    groups = np.array([s.group for s in seqs])
    adv = np.zeros(len(seqs))
    if o.advantage == "reinforce":
        return (r - o.reinforce_baseline) / (r.std() + 1e-6)  # REINFORCE++: batch std
    for g in set(groups.tolist()):
        ix = np.flatnonzero(groups == g)
        rg = r[ix]
        for j, i in enumerate(ix):
            others = np.delete(rg, j)
            base = others.mean() if o.advantage == "rloo" else rg.mean()
            adv[i] = (r[i] - base) / (rg.std() + 1e-6)
    return adv


def gae_advantages(seqs: list[Seq], o: Options) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per student token: whitened GAE advantages and the returns, over the student's tokens."""
    raw, returns = [], []
    for s in seqs:
        v = student(s.old_values, s)
        rew = np.zeros(len(v))
        if o.kl == "reward":
            rew -= o.kl_penalty * k1_sampled(s)
        rew[-1] += s.score
        a = np.zeros(len(v))
        running = 0.0
        for t in reversed(range(len(v))):
            nxt = v[t + 1] if t + 1 < len(v) else 0.0
            running = rew[t] + o.gamma * nxt - v[t] + o.gamma * o.lam * running
            a[t] = running
        raw.append(a)
        returns.append(a + v)
    flat = np.concatenate(raw)
    return [(a - flat.mean()) / (flat.std() + 1e-8) for a in raw], returns


def weights(seqs: list[Seq], o: Options) -> list[float]:
    n = [int(s.mask.sum()) for s in seqs]
    agg = aggregation(o)
    if agg == "token":
        return [1.0 / sum(n)] * len(seqs)
    if agg == "sequence":
        return [1.0 / (len(seqs) * k) for k in n]
    return [1.0 / (o.max_new_tokens * (o.batch_sequences or len(seqs)))] * len(seqs)


def kl_term(logp: np.ndarray, ref: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(k, dk / dlogp) per token."""
    log_r = ref - logp
    if kind == "k1":
        return -log_r, np.ones_like(logp)
    if kind == "k2":
        return 0.5 * log_r**2, -log_r
    return np.exp(log_r) - 1 - log_r, 1 - np.exp(log_r)


def policy_term(logp: np.ndarray, old: np.ndarray, a: np.ndarray, o: Options
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loss, d loss / d logp, clip active) per student token of one sequence."""
    lo, hi = clip_range(o)
    if o.ratio_level == "sequence":
        ratio = np.full(len(logp), np.exp(np.mean(logp - old)))  # s_i on every token
    else:
        ratio = np.exp(logp - old)
    bounded = np.clip(ratio, 1 - lo, 1 + hi)
    if o.loss == "cispo":
        return -bounded * a * logp, -bounded * a, bounded != ratio
    unclipped, clipped = -a * ratio, -a * bounded
    active = clipped > unclipped
    # d ratio_t / d logp_t = ratio_t, for r_t and for GSPO-token's s_it alike
    return np.maximum(unclipped, clipped), np.where(active, 0.0, -a * ratio), active


def value_term(v: np.ndarray, old: np.ndarray, ret: np.ndarray, c: float
               ) -> tuple[np.ndarray, np.ndarray]:
    """(PPO2's clipped value loss, its d / dV) per token."""
    plain = (v - ret) ** 2
    vc = old + np.clip(v - old, -c, c)
    clipped = (vc - ret) ** 2
    inside = np.abs(v - old) < c
    use_clipped = clipped > plain
    return 0.5 * np.maximum(plain, clipped), np.where(use_clipped, (vc - ret) * inside,
                                                      v - ret)


def objective(seqs: list[Seq], o: Options) -> Result:
    """The loss of the batch and its gradients (over each sequence's whole completion: 0 on
    feedback tokens)."""
    if o.advantage == "gae":
        adv, returns = gae_advantages(seqs, o)
    else:
        per_seq = sequence_advantages(seqs, o)
        adv = [np.full(int(s.mask.sum()), a) for s, a in zip(seqs, per_seq, strict=True)]
        returns = [None] * len(seqs)
    if o.distill_coef:
        adv = [o.weight_reward * a + distill_term(s, o) for s, a in zip(seqs, adv, strict=True)]
    loss, clipped, d_lp, d_h, d_v = 0.0, 0.0, [], [], []
    for s, w, a, ret in zip(seqs, weights(seqs, o), adv, returns, strict=True):
        lp, old, h = student(s.logp, s), student(s.old, s), student(s.entropy, s)
        pg, g, active = policy_term(lp, old, a, o)
        total = pg - o.entropy_coef * h
        clipped += active.sum()
        if o.kl == "loss":
            k, dk = kl_term(lp, student(s.ref, s), o.kl_estimator)
            total, g = total + o.kl_penalty * k, g + o.kl_penalty * dk
        dv = np.zeros(len(s.mask))
        if o.advantage == "gae":
            vl, dvl = value_term(student(s.values, s), student(s.old_values, s), ret,
                                 o.value_clip)
            total = total + o.value_coef * vl
            dv[s.mask == 1] = w * o.value_coef * dvl
        loss += w * total.sum()
        d_lp.append(_scatter(w * g, s))
        d_h.append(_scatter(np.full(len(lp), -w * o.entropy_coef), s))
        d_v.append(dv)
    return Result(loss, d_lp, d_h, d_v, kl_reported(seqs, o), float(clipped))


def distill_term(s: Seq, o: Options) -> np.ndarray:
    """coef (log p_target - log old) per student token, clipped to +-clip (clip > 0)."""
    d = o.distill_coef * (student(s.teacher, s) - student(s.old, s))
    return np.clip(d, -o.distill_clip, o.distill_clip) if o.distill_clip > 0 else d


def distill_kl(seqs: list[Seq]) -> float:
    """The mean of log old - log p_target over every student token."""
    return float(np.concatenate([student(s.old - s.teacher, s) for s in seqs]).mean())


def kl_reported(seqs: list[Seq], o: Options) -> float | None:
    """kl/mean: k1's mean over the student's tokens, of the sampler's log-probs (KL in the
    reward) or of the current policy's (KL in the loss)."""
    if o.kl == "off":
        return None
    if o.kl == "reward":
        return float(np.concatenate([k1_sampled(s) for s in seqs]).mean())
    return float(np.concatenate([student(s.logp - s.ref, s) for s in seqs]).mean())


def _scatter(x: np.ndarray, s: Seq) -> np.ndarray:
    out = np.zeros(len(s.mask))
    out[s.mask == 1] = x
    return out
