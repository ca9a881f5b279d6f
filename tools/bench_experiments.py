"""The fifth and sixth rounds' speed experiments on the tiny model (BENCHMARKS.md, "Fifth round"
and "Sixth round"): each case an in-process A/B, variants interleaved, medians; run from the
repository root after `python tools/bench.py` has built `.bench/models/tiny` (and, for
`coretype`, the peer's venv).

    python tools/bench_experiments.py CASE [--rounds N]

Cases:
  decode-threads   CPU time of each thread while decoding, as a share of wall time
  decode-width     ms per decode step at 1 .. 32 rows
  compiled-decode  the whole decode step under mx.compile over a fixed-size KV cache vs ours
  fewer-nodes      decode with a compiled RMSNorm and without the custom-VJP wrappers vs ours
  pipeline-depth   decode steps queued ahead: 1 (ours), 2, 3
  poly-exp         exp as a polynomial + exponent bits (shapeless MLX ops, three kernels) instead
                   of powf, per phase (fifth round, before `cpu_kernels.pow2`)
  split-head       the decode's vocabulary product split over two CPU streams vs one
  ref-stream       reference pass + forward/backward: host arrays (ours), device arrays, one
                   graph, the reference on a second stream
  coretype         side by side with the peer: this environment's OPENBLAS_* vs autodetected

Sixth round:
  compiled-update  RL steps: the update eager vs under mx.compile (ours)
  pow2-kernels     RL steps, then rollouts alone: SwiGLU and the sampler with mx.power vs
                   cpu_kernels.pow2 (ours)
  poly-softmax     RL steps: pow2 also for the vocabulary log-softmax, then for the attention
  train-streams    reference pass (ours: two streams) / update (ours: one): two MLX CPU streams
                   at 1 OpenBLAS thread each vs one at 2
  exp-kernels      e**x over [520, 4096]: mx.exp, mx.power, compiled pow2; errors and ms
  prefill          rollouts: the prompts prefilled in one batch vs each on its own (2 and 8)

Not covered: these are experiments, not the benchmark (tools/bench.py); most variants here
monkeypatch the package and were not adopted.
"""

from __future__ import annotations

import argparse
import os
import statistics as st
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
MODEL = str(ROOT / ".bench" / "models" / "tiny")
LOG2E = 1.4426950408889634


def interleave(cases: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median ms of each case, round-robin (order reversed every other round), after a warm-up."""
    for f in cases.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(rounds):
        for k, f in (list(cases.items()) if r % 2 else list(cases.items())[::-1]):
            tic = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - tic)
    out = {k: round(st.median(v) * 1000, 1) for k, v in times.items()}
    print(out)
    return out


def tiny() -> tuple[Any, Any, list, int]:
    import bench

    from mlx_rlaif.backends.mlx import load_policy

    pol = load_policy(MODEL)
    eos = bench._force_length(pol.tokenizer, pol.model)
    return pol.model, pol.tokenizer, bench._chat_prompts(pol.tokenizer, bench.PROMPTS), eos


def rollout_fn(model: Any, prompts: list, eos: int, G: int = 4) -> Callable[[], Any]:
    from mlx_rlaif.rollout import SamplingParams, generate

    params = SamplingParams(temperature=1.0, max_new_tokens=64)
    return lambda: generate(model, prompts, G, params, [eos])


def ours_run() -> Any:
    import bench

    spec = {"model": MODEL, "P": 2, "G": 4, "max_tokens": 64, "kl": 0.02,
            "prompts": bench.PROMPTS}
    return bench.Ours(spec)


# --- decoding -------------------------------------------------------------------------------------


def decode_threads(rounds: int) -> None:
    model, _, prompts, eos = tiny()
    roll = rollout_fn(model, prompts, eos)
    roll()

    def cpu() -> dict[str, float]:
        out = {}
        for t in os.listdir("/proc/self/task"):
            f = Path(f"/proc/self/task/{t}/stat").read_text().rsplit(")", 1)[1].split()
            out[t] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        return out

    c0, tic = cpu(), time.perf_counter()
    for _ in range(rounds * 3):
        roll()
    wall, c1 = time.perf_counter() - tic, cpu()
    main = str(threading.get_native_id())
    print(f"rollout {wall / (rounds * 3) * 1000:.1f} ms")
    for t, v in c1.items():
        if v - c0.get(t, 0) > 0.01:
            print(("main thread" if t == main else f"thread {t}"),
                  f"busy {(v - c0.get(t, 0)) / wall:.2f} of wall time")


def decode_width(rounds: int) -> None:
    model, _, prompts, eos = tiny()
    cases = {f"{g} rows": rollout_fn(model, prompts[:1], eos, g) for g in (1, 2, 4, 8, 16, 32)}
    ms = interleave(cases, rounds)
    print({k: round(v / 64, 2) for k, v in ms.items()}, "ms per step")


class StaticKV:
    """A fixed-size KV cache: every row writes slot `pos`; row b sees slots start[b] .. pos."""

    def __init__(self, keys: Any, values: Any, pos: Any, start: Any) -> None:
        self.keys, self.values, self.pos, self.start = keys, values, pos, start
        self.offset = pos - start

    def update_and_fetch(self, k: Any, v: Any) -> tuple[Any, Any]:
        import mlx.core as mx

        self.keys = mx.slice_update(self.keys, k, self.pos.reshape(1), axes=(2,))
        self.values = mx.slice_update(self.values, v, self.pos.reshape(1), axes=(2,))
        return self.keys, self.values

    def make_mask(self, n: int, return_array: bool = False, window_size: Any = None) -> Any:
        import mlx.core as mx

        j = mx.arange(self.keys.shape[2])
        return ((j[None] >= self.start[:, None]) & (j[None] <= self.pos))[:, None, None, :]


def compiled_decode(rounds: int) -> None:
    import mlx.core as mx

    from mlx_rlaif.backends.mlx import lora_fused
    from mlx_rlaif.cpu_kernels import decode_rope, fast_cpu_kernels
    from mlx_rlaif.decode import picker
    from mlx_rlaif.rollout import _prefill

    model, _, prompts, eos = tiny()
    pick, T, rows = picker(1.0), 64, [i // 4 for i in range(8)]

    def static() -> None:
        with lora_fused(model, 2**30), fast_cpu_kernels(model), decode_rope(model):
            caches = [_prefill(model, p) for p in prompts]
            n = [len(p) - 1 for p in prompts]
            s0, idx, ks, vs = max(n), mx.array(rows), [], []
            for layer in range(len(model.layers)):
                kk, vv = [], []
                for p, c in enumerate(caches):
                    for src, dst in ((c[layer].keys, kk), (c[layer].values, vv)):
                        x = src[..., : n[p], :]
                        pad = [mx.zeros((1, x.shape[1], w, x.shape[3]), x.dtype)
                               for w in (s0 - n[p], T)]
                        dst.append(mx.concatenate([pad[0], x, pad[1]], axis=2))
                ks.append(mx.concatenate(kk)[idx])
                vs.append(mx.concatenate(vv)[idx])
            start = mx.array([s0 - n[p] for p in rows])

            def fn(y: Any, pos: Any, start: Any, ks: list, vs: list) -> tuple:
                cache = [StaticKV(k, v, pos, start) for k, v in zip(ks, vs, strict=True)]
                tok, lp = pick(model(y[:, None], cache=cache)[:, -1])
                return tok, lp, [c.keys for c in cache], [c.values for c in cache]

            step = mx.compile(fn, inputs=[mx.random.state], outputs=[mx.random.state])
            y = mx.array([prompts[p][-1] for p in rows], dtype=mx.uint32)
            out = step(y, mx.array(s0), start, ks, vs)
            mx.async_eval(out[0], out[1])
            del ks, vs
            for t in range(1, T):
                nxt = step(out[0], mx.array(s0 + t), start, out[2], out[3])
                mx.async_eval(nxt[0], nxt[1])
                out[0].tolist()
                out[1].tolist()
                out = nxt
            out[0].tolist()

    interleave({"ours": rollout_fn(model, prompts, eos), "compiled static cache": static},
               rounds)


def fewer_nodes(rounds: int) -> None:
    import mlx.core as mx

    from mlx_rlaif import cpu_kernels as ck

    model, _, prompts, eos = tiny()
    orig_rms, swaps = mx.fast.rms_norm, ck._SWAPS

    @partial(mx.compile, shapeless=True)
    def rms_fwd(x: Any, w: Any, eps: Any) -> Any:
        return x * mx.rsqrt(mx.mean(mx.square(x), axis=-1, keepdims=True) + eps) * w

    def rms(x: Any, w: Any, eps: float) -> Any:
        return orig_rms(x, w, eps) if w is None else rms_fwd(x, w, mx.array(eps, x.dtype))

    def plain_sdpa(q: Any, k: Any, v: Any, cache: Any, scale: float, mask: Any,
                   sinks: Any = None) -> Any:
        B, Hq, L, _ = q.shape
        Hk, S = k.shape[1], k.shape[2]
        m = ck._mask_array(mask, L, S, Hq, Hk)
        qs = (q * scale).reshape(B, Hk, (Hq // Hk) * L, q.shape[-1])
        return (ck._probs(qs, k, m).astype(v.dtype) @ v).reshape(B, Hq, L, v.shape[-1])

    roll = rollout_fn(model, prompts, eos)

    def variant(compiled_rms: bool, plain: bool) -> Callable[[], Any]:
        def run() -> Any:
            mx.fast.rms_norm = rms if compiled_rms else orig_rms
            ck._SWAPS = ((swaps[0][0], ck._swiglu), (swaps[1][0], plain_sdpa)) if plain \
                else swaps
            try:
                return roll()
            finally:
                mx.fast.rms_norm, ck._SWAPS = orig_rms, swaps
        return run

    interleave({"ours": variant(False, False), "compiled rms": variant(True, False),
                "no vjp wrappers": variant(False, True), "both": variant(True, True)}, rounds)


def pipeline_depth(rounds: int) -> None:
    import mlx.core as mx

    from mlx_rlaif.backends.mlx import lora_fused
    from mlx_rlaif.cpu_kernels import decode_rope, fast_cpu_kernels
    from mlx_rlaif.decode import merged_cache, picker
    from mlx_rlaif.rollout import _prefill

    model, _, prompts, _ = tiny()
    pick = picker(1.0)

    def run(depth: int) -> Callable[[], None]:
        def go() -> None:
            with lora_fused(model, 2**30), fast_cpu_kernels(model), decode_rope(model):
                caches = [_prefill(model, p) for p in prompts]
                cache = merged_cache([caches[i // 4] for i in range(8)])
                y = mx.array([p[-1] for p in prompts for _ in range(4)], dtype=mx.uint32)
                queue: list = []
                for _ in range(64):
                    out = pick(model(y[:, None], cache=cache)[:, -1])
                    mx.async_eval(*out)
                    queue.append(out)
                    y = out[0]
                    if len(queue) > depth:
                        o = queue.pop(0)
                        o[0].tolist()
                        o[1].tolist()
                for o in queue:
                    o[0].tolist()
        return go

    interleave({f"{d} queued": run(d) for d in (1, 2, 3)}, rounds)


# --- exp, streams, reference ----------------------------------------------------------------------

_ROUND = 12582912.0  # 1.5 * 2**23: adding and subtracting it rounds to the nearest integer
_POLY = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3,
         5.550332471162809e-2, 2.402264791363012e-1, 6.931472028550421e-1, 1.0)


def poly_exp_kernels() -> dict[str, Any]:
    """exp and SwiGLU with 2**y as a polynomial of y's fraction times 2**round(y) built from
    exponent bits (the algorithm of MLX's own vectorized exp), in compiled MLX ops."""
    import mlx.core as mx

    def parts(y: Any) -> tuple[Any, Any]:
        y = mx.clip(y, -125.5, 127.0)
        r = (y + _ROUND) - _ROUND
        f, p = y - r, _POLY[0]
        for c in _POLY[1:]:
            p = p * f + c
        return p, mx.left_shift(r.astype(mx.int32) + 127, 23)

    parts_e = mx.compile(lambda x: parts(x * LOG2E), shapeless=True)
    parts_ne = mx.compile(lambda x: parts(x * -LOG2E), shapeless=True)
    mul = mx.compile(lambda p, s: p * s, shapeless=True)

    def exp2e(x: Any) -> Any:
        p, e = parts_e(x)
        return mul(p, mx.view(e, mx.float32))

    sw = mx.compile(lambda g, x, p, s: g * x / (1.0 + p * s), shapeless=True)

    @partial(mx.compile, shapeless=True)
    def sw_vjp(g: Any, x: Any, c: Any, p: Any, s2: Any) -> tuple[Any, Any]:
        s = 1.0 / (1.0 + p * s2)
        silu = g * s
        return c * x * (s + silu * (1.0 - s)), c * silu

    def sig_parts(g: Any) -> tuple[Any, Any]:
        p, e = parts_ne(g)
        return p, mx.view(e, mx.float32)

    @mx.custom_function
    def exp_d(x: Any) -> Any:
        return exp2e(x)

    @exp_d.vjp
    def _exp_d_vjp(primals: Any, cotangent: Any, output: Any) -> tuple:
        return (cotangent * output,)

    return {"exp2e": exp2e, "_swiglu": lambda g, x: sw(g, x, *sig_parts(g)),
            "_swiglu_vjp": lambda g, x, c: sw_vjp(g, x, c, *sig_parts(g)), "exp": exp_d}


def poly_exp(rounds: int) -> None:
    import numpy as np

    from mlx_rlaif import cpu_kernels as ck
    from mlx_rlaif import decode, losses

    ours = ours_run()
    run, ops = ours.run, ours.run.ops
    rollouts, _ = ops.sample(run, ours.tasks, 0)
    adv = np.linspace(-1, 1, len(rollouts)).astype(np.float32)
    fast = poly_exp_kernels()
    orig = {"exp2e": ck.exp2e, "_swiglu": ck._swiglu, "_swiglu_vjp": ck._swiglu_vjp,
            "exp": losses.exp}
    phases: dict[str, list] = {}

    def use(k: dict) -> None:
        ck.exp2e, ck._swiglu, ck._swiglu_vjp = k["exp2e"], k["_swiglu"], k["_swiglu_vjp"]
        losses.exp = decode.exp = k["exp"]

    def variant(name: str, kernels: dict) -> Callable[[], None]:
        def go() -> None:
            use(kernels)
            try:
                t0 = time.perf_counter()
                ops.sample(run, ours.tasks, 1)
                t1 = time.perf_counter()
                ops.update(run, rollouts, adv, ops.reference(run, rollouts))
                phases.setdefault(name, []).append((t1 - t0, time.perf_counter() - t1))
            finally:
                use(orig)
        return go

    interleave({"powf (ours)": variant("powf", orig), "polynomial": variant("poly", fast)},
               rounds)
    for name, v in phases.items():
        print(name, "sample / reference+update ms",
              [round(st.median(x) * 1000, 1) for x in zip(*v, strict=True)])


def split_head(rounds: int) -> None:
    import mlx.core as mx

    model, _, prompts, eos = tiny()
    emb, s2 = model.model.embed_tokens, mx.new_stream(mx.cpu)
    orig = emb.as_linear
    half = emb.weight.shape[0] // 2
    halves = (emb.weight[:half], emb.weight[half:])
    mx.eval(halves)

    def split(x: Any) -> Any:
        if x.shape[1] != 1:
            return orig(x)
        a = x @ halves[0].T
        with mx.stream(s2):
            b = x @ halves[1].T
        return mx.concatenate([a, b], axis=-1)

    roll = rollout_fn(model, prompts, eos)

    def variant(f: Callable) -> Callable[[], Any]:
        def go() -> Any:
            emb.as_linear = f
            try:
                return roll()
            finally:
                emb.as_linear = orig
        return go

    interleave({"one stream (ours)": variant(orig), "two streams": variant(split)}, rounds)


def ref_stream(rounds: int) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np

    from mlx_rlaif import batch as batching
    from mlx_rlaif.cpu_kernels import training_fast_paths
    from mlx_rlaif.losses import rl_loss
    from mlx_rlaif.update import build, micro_batches, reference_logprobs

    ours = ours_run()
    run, cfg, model = ours.run, ours.run.cfg, ours.run.policy.model
    rollouts, _ = run.ops.sample(run, ours.tasks, 0)
    w = batching.aggregation_weights([len(r.tokens) for r in rollouts], "token", 0)
    adv = np.linspace(-1, 1, len(rollouts))
    vg = nn.value_and_grad(model, partial(rl_loss, rl=cfg.rl, kl_coef=0.02, temperature=1.0))
    s2 = mx.new_stream(mx.cpu)

    def mbs(ref: Any) -> list:
        return [build(rollouts, rows, adv, w, ref, shared)
                for rows, shared in micro_batches(model, rollouts, cfg)]

    def sequential() -> None:
        mx.eval([vg(model, mb) for mb in mbs(reference_logprobs(model, rollouts, cfg))])

    def one_graph(stream: Any, evaluate_first: bool) -> Callable[[], None]:
        def go() -> None:
            batches = mbs(None)
            with mx.stream(stream):
                _lazy_reference(model, batches)
            if evaluate_first:
                mx.eval([mb["ref_logp"] for mb in batches])
            mx.eval([vg(model, mb) for mb in batches])
        return go

    with training_fast_paths(model):
        interleave({"sequential, host arrays (ours)": sequential,
                    "reference evaluated first, device arrays": one_graph(mx.default_stream(mx.cpu), True),
                    "one graph": one_graph(mx.default_stream(mx.cpu), False),
                    "one graph, reference on a second stream": one_graph(s2, False)}, rounds)


def _lazy_reference(model: Any, mbs: list) -> None:
    from mlx_rlaif import shared_prompt
    from mlx_rlaif.backends.mlx import lora_disabled
    from mlx_rlaif.losses import logprobs_and_entropy

    with lora_disabled(model):
        for mb in mbs:
            logp = logprobs_and_entropy(shared_prompt.batch_logits(model, mb),
                                        mb["tokens"][:, 1:], 1.0)[0]
            mb["ref_logp"] = logp * mb["mask"]


def coretype(rounds: int) -> None:
    import bench

    python = bench.ensure_peer_venv(ROOT / ".bench" / "peer-venv")
    spec = {"P": 2, "G": 4, "max_tokens": 64, "prompts": bench.PROMPTS, "model": MODEL,
            "reps": 4, "kl": 0.02}
    res: dict[str, list] = {"environment": [], "autodetected": []}
    for _ in range(rounds):
        for k in res:
            env = bench.fast_env()
            if k == "autodetected":
                env = {n: v for n, v in env.items() if n not in ("OPENBLAS_CORETYPE",
                                                                  "OPENBLAS_L2_SIZE")}
            res[k].append(bench.run_worker("duel", spec, env, python=python))
    for k, v in res.items():
        ratio = st.median([x for d in v for x in d["ratio"]])
        ours = st.median([x for d in v for x in d["ours"]["step_s"]])
        peer = st.median([x for d in v for x in d["peer"]["step_s"]])
        print(f"{k}: ratio {ratio:.2f}x, ours {ours:.3f} s, peer {peer:.3f} s")


# --- sixth round ----------------------------------------------------------------------------------


def _steps(variants: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], rounds: int) -> None:
    """RL steps (sample, reference pass, update) of the tiny model, alternating between the
    variants (the order alternating too), each with its own compiled traces; medians per phase.
    A variant is (context for the sampling, context for the reference pass and the update)."""
    import numpy as np

    from mlx_rlaif import update as U
    from mlx_rlaif.cpu_kernels import training_fast_paths

    ours = ours_run()
    run, names = ours.run, list(variants)
    model, cfg = run.policy.model, run.cfg
    adv = np.linspace(-1, 1, 8).astype(np.float32)
    traced: dict[str, dict] = {k: {} for k in names}
    times: dict[str, dict[str, list]] = {k: {"sample": [], "reference": [], "update": []}
                                         for k in names}
    for i in range(2 * rounds + 2):  # the first two (one each) are warm-ups
        name = names[(i + i // 2) % 2]
        sample_ctx, train_ctx = variants[name]
        t0 = time.perf_counter()
        with sample_ctx():
            rollouts, _ = run.ops.sample(run, ours.tasks, i)
        t1 = time.perf_counter()
        with train_ctx(), training_fast_paths(model):
            ref = U.reference_logprobs(model, rollouts, cfg)
            t2 = time.perf_counter()
            U.update(run, rollouts, adv, ref, traced[name])
        t3 = time.perf_counter()
        if i >= 2:
            for k, v in zip(times[name], (t1 - t0, t2 - t1, t3 - t2), strict=True):
                times[name][k].append(v)
    for name, d in times.items():
        ms = {k: round(st.median(v) * 1000, 1) for k, v in d.items()}
        print(f"{name}: {ms}, step {round(sum(ms.values()), 1)}")


def _patched(module: Any, **attrs: Any) -> Callable[[], Any]:
    """A context factory: `module`'s attributes replaced within the block."""
    import contextlib

    @contextlib.contextmanager
    def ctx() -> Any:
        old = {k: getattr(module, k) for k in attrs}
        for k, v in attrs.items():
            setattr(module, k, v)
        try:
            yield
        finally:
            for k, v in old.items():
                setattr(module, k, v)
    return ctx


def compiled_update(rounds: int) -> None:
    import contextlib

    from mlx_rlaif import update

    none = contextlib.nullcontext
    eager = _patched(update, compiled=lambda fn, model, *more: fn)
    _steps({"eager": (none, eager), "compiled (ours)": (none, none)}, rounds)


def _powf_kernels() -> tuple[Any, Any, Any]:
    """SwiGLU (forward, backward) and the sampler as they were before `pow2`: `mx.power`."""
    import mlx.core as mx

    from mlx_rlaif import cpu_kernels as ck
    from mlx_rlaif import decode, losses

    def sigmoid(x: Any) -> Any:
        return 1.0 / (1.0 + mx.power(2.0, mx.clip(x * -ck.LOG2E, ck.FLOOR, 126.0)))

    @partial(mx.compile, shapeless=True)
    def swiglu(g: Any, x: Any) -> Any:
        return g * sigmoid(g) * x

    @partial(mx.compile, shapeless=True)
    def swiglu_vjp(g: Any, x: Any, c: Any) -> tuple[Any, Any]:
        s = sigmoid(g)
        silu = g * s
        return c * x * (s + silu * (1.0 - s)), c * silu

    return swiglu, swiglu_vjp, partial(decode._inverse_cdf, exp=losses.exp)


def pow2_kernels(rounds: int) -> None:
    import contextlib

    from mlx_rlaif import cpu_kernels as ck
    from mlx_rlaif import decode

    none = contextlib.nullcontext
    swiglu, swiglu_vjp, draw = _powf_kernels()
    old_kernels = _patched(ck, _swiglu=swiglu, _swiglu_vjp=swiglu_vjp)
    old_sampler = _patched(decode, _draw_cpu=draw)

    @contextlib.contextmanager
    def old_decoding() -> Any:
        with old_kernels(), old_sampler():
            yield

    _steps({"mx.power": (old_decoding, old_kernels), "pow2 (ours)": (none, none)}, rounds)
    print("decoding alone (rollouts):")
    model, _, prompts, eos = tiny()
    f = rollout_fn(model, prompts, eos)

    def within(ctx: Callable[[], Any]) -> Callable[[], None]:
        def go() -> None:
            with ctx():
                f()
        return go

    interleave({"pow2 (ours)": f, "mx.power, SwiGLU only": within(old_kernels),
                "mx.power, sampler only": within(old_sampler),
                "mx.power": within(old_decoding)}, rounds)


def poly_softmax(rounds: int) -> None:
    """The vocabulary log-softmax's and the attention's exponentials as compiled `pow2` too,
    in the reference pass and the update (the attention keeps mx.power while decoding)."""
    import contextlib

    import mlx.core as mx

    from mlx_rlaif import cpu_kernels as ck
    from mlx_rlaif import losses

    exp2e = mx.compile(lambda x: ck.pow2(mx.maximum(x * ck.LOG2E, ck.FLOOR)))

    @mx.custom_function
    def exp(x: Any) -> Any:
        return exp2e(x)

    @exp.vjp
    def _exp_vjp(primals: Any, cotangent: Any, output: Any) -> Any:
        return cotangent * output

    none = contextlib.nullcontext
    which = {"vocabulary": _patched(losses, exp=exp), "attention": _patched(ck, exp2e=exp2e)}
    for name, ctx in which.items():
        _steps({"mx.power (ours)": (none, none), f"pow2 for the {name}": (none, ctx)}, rounds)


def train_streams(rounds: int) -> None:
    """The reference pass (update.reference_logprobs) and the update's forward + backward with
    the batch's two prompt groups on two MLX CPU streams (one OpenBLAS thread each) vs one
    stream (two threads)."""
    from dataclasses import replace

    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_map

    from mlx_rlaif import batch as batching
    from mlx_rlaif import blas
    from mlx_rlaif import update as U
    from mlx_rlaif.cpu_kernels import training_fast_paths
    from mlx_rlaif.update import build, grad_fn, micro_batches, reference_logprobs

    ours = ours_run()
    run, cfg, model = ours.run, ours.run.cfg, ours.run.policy.model
    rollouts, _ = run.ops.sample(run, ours.tasks, 0)
    w = batching.aggregation_weights([len(r.tokens) for r in rollouts], "token", 0)
    adv, kl = np.linspace(-1, 1, len(rollouts)), mx.array(0.02)
    with training_fast_paths(model):
        ref = reference_logprobs(model, rollouts, cfg)
    halves = replace(cfg, training=replace(cfg.training, micro_batch_size=4))
    one = [build(rollouts, r, adv, w, ref, s) for r, s in micro_batches(model, rollouts, cfg)]
    two = [build(rollouts, r, adv, w, ref, s) for r, s in micro_batches(model, rollouts, halves)]
    grad, streams = grad_fn(model, cfg), U._cpu_streams()

    def update(mbs: list, n: int) -> Callable[[], None]:
        def go() -> None:
            outs = []
            with blas.blas_threads(n):
                for mb, s in zip(mbs, streams, strict=False):  # one batch: one stream
                    with mx.stream(s):
                        outs.append(grad(mb, kl))
                mx.eval(outs[0] if len(outs) == 1 else tree_map(mx.add, outs[0], outs[1]))
        return go

    def reference(n: int) -> Callable[[], None]:  # update.reference_logprobs on n streams
        def go() -> None:
            U.reference_streams, real = (lambda cfg, rows: streams[:n]), U.reference_streams
            try:
                reference_logprobs(model, rollouts, cfg)
            finally:
                U.reference_streams = real
        return go

    with training_fast_paths(model):
        interleave({"update, one stream, 2 threads (ours)": update(one, 2),
                    "update, two streams, 1 thread each": update(two, 1),
                    "reference, one stream, 2 threads": reference(1),
                    "reference, two streams, 1 thread each (ours)": reference(2)}, rounds)


def exp_kernels(rounds: int) -> None:
    """e**x over a [520, 4096] array (the update's vocabulary log-softmax): MLX's exp, its power
    (our kernels before `pow2`), and `cpu_kernels.pow2` compiled, with their largest relative
    error against float64 over the normal float range."""
    import mlx.core as mx
    import numpy as np

    from mlx_rlaif import cpu_kernels as ck

    x = mx.random.normal((520, 4096)) * 4 - 8
    mx.eval(x)
    fns = {"mx.exp": mx.exp,
           "mx.power(2, x log2 e)": mx.compile(lambda a: mx.power(2.0, a * ck.LOG2E)),
           "pow2 (compiled)": mx.compile(lambda a: ck.pow2(mx.maximum(a * ck.LOG2E, ck.FLOOR)))}
    want = np.exp(np.array(x, dtype=np.float64))
    for k, f in fns.items():
        got = np.array(f(x), dtype=np.float64)
        print(f"{k}: max relative error {np.max(np.abs(got - want) / want):.2e}")
    interleave({k: (lambda f=f: mx.eval(f(x))) for k, f in fns.items()}, rounds)


def prefill(rounds: int) -> None:
    """Rollouts with the prompts prefilled in one left-padded forward (ours) vs each on its own
    and merged, at the benchmark's 2 prompts x 4 and at 8 prompts (21-45 tokens) x 1."""
    import random

    from mlx_rlaif import rollout, shared_prompt

    model, _, prompts, eos = tiny()
    random.seed(0)
    eight = [p[:random.randint(20, len(p))] if i else p for i, p in enumerate(prompts * 4)]
    real = shared_prompt.supported

    def per_prompt(f: Callable[[], Any]) -> Callable[[], None]:
        def go() -> None:
            rollout.shared_prompt.supported = lambda m: False
            try:
                f()
            finally:
                rollout.shared_prompt.supported = real
        return go

    for name, f in (("2 x 4", rollout_fn(model, prompts, eos)),
                    ("8 x 1", rollout_fn(model, eight, eos, G=1))):
        print(name)
        interleave({"one prefill (ours)": f, "per-prompt prefills + merge": per_prompt(f)},
                   rounds)


CASES = {"decode-threads": decode_threads, "decode-width": decode_width,
         "compiled-decode": compiled_decode, "fewer-nodes": fewer_nodes,
         "pipeline-depth": pipeline_depth, "poly-exp": poly_exp, "split-head": split_head,
         "ref-stream": ref_stream, "coretype": coretype, "compiled-update": compiled_update,
         "pow2-kernels": pow2_kernels, "poly-softmax": poly_softmax,
         "train-streams": train_streams, "exp-kernels": exp_kernels, "prefill": prefill}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args()
    if args.case != "coretype":  # its workers get their environment from bench.fast_env
        from mlx_rlaif.blas import maybe_reexec_with_fast_blas

        maybe_reexec_with_fast_blas([sys.executable, *sys.argv])
    CASES[args.case](args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
