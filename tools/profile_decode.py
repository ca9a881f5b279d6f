"""Where a decode step goes: per-step host and device time of the rollouts' decode loops, with
and without fused LoRA, and the loop side by side with mlx-lm's `BatchGenerator` (tokens/s).

    python tools/profile_decode.py                                  # tiny, widths 4-32, fp32
    python tools/profile_decode.py --shape qwen0.5b --dtype bfloat16 --widths 16,32 \\
        --tokens 256 --loops compiled --json out.json               # a GPU check (~1 minute)
    python tools/profile_decode.py --compare --widths 32 --reps 5   # tokens/s: ours, eager,
                                                                    # mlx-lm, same run
    python tools/profile_decode.py --ablate attention,sampler,kv_write --widths 32 --reps 7
    perf record -F 2000 -- python tools/profile_decode.py --rollouts 40 --widths 32
                                                   # the loop alone, for a sampling profiler

Models are random-weight Qwen2s of `mlx_rlaif.testing.randmodel`'s shapes (`tiny`: 4 layers of
width 256, vocabulary 4,096; `qwen0.5b`: Qwen2.5-0.5B's) built in memory, LoRA rank 8 on every
linear layer as the trainer adds it; W rows are W // 8 prompts (at least 1) of `--prompt-len`
random tokens (+3 per prompt) with their groups, every completion forced to `--tokens` (EOS is
an id the model cannot sample), or stopping with probability about `--stop-prob` a step (a
share of the vocabulary as EOS ids), so rows finish at different steps and the width shrinks.

Loops (`--loops`): `compiled` (compiled_decode.py: what rollouts run) and `eager` (decode.py:
the loop before it, still the fallback). LoRA (`--lora`): `fused` (adapters fused into a copy
for decoding, as `generation.fuse_lora_max_mb` allows at small sizes) or `unfused`.

Method. Each setting runs once untimed (traces and kernels are compiled then), then twice
through `rollout.generate` with a clock the loop calls at each phase boundary of a step:
- as it runs (`piped`): wall time per step and per phase: `build` (Python builds the step's
  graph, or calls the compiled step), `dispatch` (`mx.async_eval`: MLX walks the graph and
  queues its work; on a GPU it encodes and launches the kernels from this thread; on MLX's CPU
  build, which lets at most ~100 ops be queued, it also waits for the previous step's last
  ops), `read` (`tolist` of a step's tokens and log-probs: waiting for the device, then the
  copy), `book` (recording tokens, EOS checks, width changes);
- serialized (`sync`): the same, with `mx.synchronize()` after each dispatch, so a step's
  device work runs alone: `wait` is the time from the dispatch's return until the device is
  done. Device time of a step = dispatch + wait (an upper bound: it includes MLX's own
  host-side work for the step); host time = build + read + book; the host share is
  host / (host + device). `device_busy` = device time (sync) / wall time per step (piped): how
  much of a running step the device is working, at most about 1.
On the CPU build the "device" is MLX's CPU stream thread (and OpenBLAS's threads), sharing the
cores with Python. Timings are medians over `--reps` runs; steps are those whose tokens were
kept. `--compare` runs ours (compiled), eager and mlx-lm's `BatchGenerator` (same model and
kernels, its own sampler and loop, rows prefilled per prompt, no log-prob read-back) at the
same width and tokens, interleaved, and reports tokens/s (prefill included) and the ratios.

`--ablate PARTS` (timing only: the tokens are wrong on purpose) runs the compiled loop whole and
with each part removed, interleaved, on MLX's CPU build: `attention` (each layer's one-query
attention returns its queries, still reading the KV buffers), `sampler` (argmax, no log-prob
pass), `kv_write` (the step's keys and values not written into the buffers), `transposed`
(the blocks' weights decoded in their own layout where the loop would transpose them: below 16
rows; tokens right up to rounding). The paired speed-up r of removing a part bounds its share
of a step: about 1 - 1/r (for `transposed`, below 1: what the layout gains).

`--json OUT` writes each setting's result as it ends, merged into OUT when it exists (one key
per setting), so a run cut short keeps what it measured.

Not covered: real weights (decoding cost does not depend on them; where rows stop does),
quantized models, prompts of real length distributions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("build", "dispatch", "wait", "read", "book")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    sys.path.insert(0, str(ROOT))
    from mlx_rlaif.cpu.blas import maybe_reexec_with_fast_blas

    maybe_reexec_with_fast_blas([sys.executable, *sys.argv])  # as the CLI runs (CPU build)
    import mlx.core as mx

    for dtype in args.dtype.split(","):
        model = build_model(args.shape, dtype, args.seed)
        for width in [int(w) for w in args.widths.split(",")]:
            setting = Setting(model, args, width)
            if args.compare:
                key = f"compare/{args.shape}/{dtype}/w{width}/T{args.tokens}"
                result = compare(setting, args.reps)
                print_compare(key, result)
                save(args, {key: result}, argv)
                continue
            if args.rollouts:
                key = f"rollouts/{args.shape}/{dtype}/w{width}/T{args.tokens}"
                result = rollouts(setting, args.rollouts)
                print(f"{key}: {result['tokens_per_s']:.0f} tok/s over {args.rollouts} rollouts",
                      flush=True)
                save(args, {key: result}, argv)
                continue
            if args.ablate:
                key = f"ablate/{args.shape}/{dtype}/w{width}/T{args.tokens}"
                result = ablate(setting, args.ablate.split(","), args.reps)
                print_ablate(key, result)
                save(args, {key: result}, argv)
                continue
            for lora in args.lora.split(","):
                for loop in args.loops.split(","):
                    key = f"{args.shape}/{dtype}/{lora}/w{width}/{loop}/T{args.tokens}"
                    result = profile(setting, loop, lora == "fused", args.reps)
                    print_profile(key, result)
                    save(args, {key: result}, argv)
        del model
        mx.clear_cache()
    return 0


def save(args: argparse.Namespace, results: dict[str, Any], argv: list[str] | None) -> None:
    """Each setting's result into `--json` as it ends, so a run cut short keeps what it did."""
    if args.json:
        write_json(Path(args.json), results, argv)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="tiny", help="randmodel shape: tiny, qwen0.5b, micro")
    ap.add_argument("--widths", default="4,8,16,32", help="rows decoding together")
    ap.add_argument("--dtype", default="float32", help="float32 and/or bfloat16 (comma list)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per completion")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--lora", default="fused,unfused", help="fused and/or unfused")
    ap.add_argument("--loops", default="compiled,eager", help="compiled and/or eager")
    ap.add_argument("--stop-prob", type=float, default=0.0,
                    help="about this chance a step that a row stops (0: every row full length)")
    ap.add_argument("--read-every", type=int, default=1, help="compiled loop: read every k steps")
    ap.add_argument("--compare", action="store_true",
                    help="tokens/s of ours, eager and mlx-lm's BatchGenerator instead")
    ap.add_argument("--ablate", default="", help="compiled loop without these parts (timing "
                    "only, CPU build): attention, sampler, kv_write")
    ap.add_argument("--rollouts", type=int, default=0, help="only run the compiled loop (fused) "
                    "this many times, after one untimed: for a sampling profiler (perf)")
    ap.add_argument("--reps", type=int, default=1, help="timed runs per setting (medians)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="write results here (merged into the file)")
    return ap.parse_args(argv)


def build_model(shape: str, dtype: str, seed: int) -> Any:
    """A random-weight Qwen2 of `shape` in `dtype`, frozen, with LoRA rank 8 (scale 20) on
    every linear layer (B random, so the adapters change the outputs), in eval mode."""
    import mlx.core as mx
    from mlx_lm.models import qwen2

    from mlx_rlaif.artifacts.lora import LoraSpec, lora_layers
    from mlx_rlaif.backends.mlx.policy import add_lora
    from mlx_rlaif.testing.randmodel import model_config

    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(model_config(shape)))
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    model.freeze()
    add_lora(model, LoraSpec(), len(model.layers))
    for _, layer in lora_layers(model):
        layer.lora_b = mx.random.normal(layer.lora_b.shape) * 1e-3
    model.train(False)
    mx.eval(model.parameters())
    return model


class Setting:
    """One width's prompts, groups, EOS ids and sampling parameters."""

    def __init__(self, model: Any, args: argparse.Namespace, width: int) -> None:
        from mlx_rlaif.backends.sampling import SamplingParams

        self.model, self.width, self.tokens = model, width, args.tokens
        self.read_every = args.read_every
        vocab = model.args.vocab_size
        rng = random.Random(args.seed)
        n_prompts = max(1, width // 8)
        self.group = width // n_prompts
        self.prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len + 3 * p)]
                        for p in range(n_prompts)]
        stop = round(args.stop_prob * vocab)
        self.eos = list(range(3, 3 + stop)) if stop else [vocab]  # vocab: never sampled
        self.params = SamplingParams(temperature=1.0, max_new_tokens=args.tokens)

    def sampling(self, fused: bool) -> Any:
        from dataclasses import replace

        return replace(self.params, fuse_lora_max_mb=2**20 if fused else 0)


class Clock:
    """The decode loop's phase hook: the time since the previous call goes to `phase`; with
    `sync`, each dispatch is followed by `mx.synchronize()`, timed as `wait`."""

    def __init__(self, sync: bool) -> None:
        self.sync, self.last = sync, None
        self.total = dict.fromkeys(PHASES, 0.0)

    def __call__(self, phase: str) -> None:
        import mlx.core as mx

        now = time.perf_counter()
        if self.last is not None:  # the first interval holds the prefill: left out
            self.total[phase] += now - self.last
        self.last = now
        if self.sync and phase == "dispatch":
            mx.synchronize()
            now = time.perf_counter()
            self.total["wait"] += now - self.last
            self.last = now


def run_ours(s: Setting, compiled: bool, fused: bool, clock: Clock | None = None
             ) -> tuple[float, int, float]:
    """(seconds, tokens, steps) of one rollout through `rollout.generate`."""
    import mlx.core as mx

    from mlx_rlaif.backends.mlx import compiled_decode
    from mlx_rlaif.backends.mlx.rollout import generate

    mx.random.seed(1)
    compiled_decode.READ_EVERY = s.read_every
    tic = time.perf_counter()
    seqs, stats = generate(s.model, s.prompts, s.group, s.sampling(fused), s.eos,
                           compiled=compiled, clock=clock)
    seconds = time.perf_counter() - tic
    tokens = sum(len(q["tokens"]) for q in seqs)
    return seconds, tokens, max(len(q["tokens"]) for q in seqs)


def run_mlx_lm(s: Setting) -> tuple[float, int]:
    """(seconds, tokens) of the same rollout in mlx-lm's `BatchGenerator`: our prefill of each
    prompt, fused adapters and kernels; its loop and sampler (temperature 1)."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    from mlx_rlaif.backends.mlx.rollout import decoding, prefill

    mx.random.seed(1)
    tic = time.perf_counter()
    tokens = 0
    with decoding(s.model, s.sampling(True)):
        gen = BatchGenerator(s.model, max_tokens=s.tokens, stop_tokens=[[e] for e in s.eos],
                             sampler=make_sampler(1.0), completion_batch_size=s.width,
                             prefill_batch_size=s.width)
        caches = [prefill(s.model, p) for p in s.prompts]
        gen.insert([[p[-1]] for p in s.prompts for _ in range(s.group)],
                   caches=[c for c in caches for _ in range(s.group)])
        try:
            while responses := gen.next_generated():
                tokens += len(responses)
        finally:
            gen.close()
    return time.perf_counter() - tic, tokens


def profile(s: Setting, loop: str, fused: bool, reps: int) -> dict[str, Any]:
    """Per-step phase times (ms), piped and serialized, of one loop at one setting."""
    compiled = loop == "compiled"
    run_ours(s, compiled, fused)  # traces, kernels, caches
    out: dict[str, Any] = {"width": s.width, "tokens": s.tokens, "loop": loop,
                           "lora": "fused" if fused else "unfused"}
    for mode in ("piped", "sync"):
        per_rep = []
        for _ in range(reps):
            clock = Clock(sync=mode == "sync")
            seconds, tokens, steps = run_ours(s, compiled, fused, clock)
            per_rep.append({"wall_ms": 1e3 * sum(clock.total.values()) / steps,
                            "tokens_per_s": tokens / seconds,
                            **{p: 1e3 * v / steps for p, v in clock.total.items()}})
        out[mode] = {k: statistics.median(r[k] for r in per_rep) for k in per_rep[0]}
    sync = out["sync"]
    host = sync["build"] + sync["read"] + sync["book"]
    device = sync["dispatch"] + sync["wait"]
    out.update(host_ms=host, device_ms=device, host_share=host / (host + device),
               device_busy=device / out["piped"]["wall_ms"])
    return out


def compare(s: Setting, reps: int) -> dict[str, Any]:
    """Tokens/s of ours (compiled), eager and mlx-lm's BatchGenerator, interleaved."""
    runs = {"ours": lambda: run_ours(s, True, True)[:2],
            "eager": lambda: run_ours(s, False, True)[:2],
            "mlx_lm": lambda: run_mlx_lm(s)}
    for f in runs.values():
        f()  # warm-up
    tps: dict[str, list[float]] = {k: [] for k in runs}
    for i in range(reps):
        order = list(runs) if i % 2 == 0 else list(reversed(runs))
        for k in order:
            seconds, tokens = runs[k]()
            tps[k].append(tokens / seconds)
    med = {k: statistics.median(v) for k, v in tps.items()}
    return {"width": s.width, "tokens": s.tokens, "tokens_per_s": med, "runs": tps,
            "ours_over_eager": med["ours"] / med["eager"],
            "ours_over_mlx_lm": med["ours"] / med["mlx_lm"],
            "paired": {"ours_over_eager": paired(tps["ours"], tps["eager"]),
                       "ours_over_mlx_lm": paired(tps["ours"], tps["mlx_lm"])}}


def rollouts(s: Setting, n: int) -> dict[str, Any]:
    """Tokens/s of `n` rollouts of the compiled loop back to back (`--rollouts`), after one
    untimed: nothing else runs, so a sampling profiler sees the loop alone."""
    run_ours(s, True, True)
    runs = [run_ours(s, True, True)[:2] for _ in range(n)]
    return {"width": s.width, "tokens": s.tokens, "rollouts": n,
            "tokens_per_s": sum(t for _, t in runs) / sum(sec for sec, _ in runs)}


def ablate(s: Setting, parts: list[str], reps: int) -> dict[str, Any]:
    """Tokens/s of the compiled loop whole and without each part, interleaved (`--ablate`)."""
    unknown = set(parts) - set(ABLATIONS)
    if unknown:
        raise SystemExit(f"--ablate: unknown part(s) {sorted(unknown)}; "
                         f"choose from {', '.join(ABLATIONS)}")
    from mlx_rlaif import cpu

    if "attention" in parts and not cpu.active():
        raise SystemExit("--ablate attention: the CPU build's decode attention only (this "
                         "device attends with mx.fast's kernel)")
    names = ["whole", *parts]
    tps: dict[str, list[float]] = {k: [] for k in names}
    traced: dict[str, dict] = {}  # each variant's compiled steps, kept from rep to rep
    for i in range(reps + 1):  # the first round traces each variant: not kept
        for name in names if i % 2 == 0 else reversed(names):
            with _without(s.model, name, traced.setdefault(name, {})):
                seconds, tokens, _ = run_ours(s, True, True)
            if i:
                tps[name].append(tokens / seconds)
    return {"width": s.width, "tokens": s.tokens, "runs": tps,
            "tokens_per_s": {k: statistics.median(v) for k, v in tps.items()},
            "paired": {k: paired(tps[k], tps["whole"]) for k in parts}}


def _no_attention(queries: Any, keys: Any, values: Any, cache: Any, scale: float, mask: Any,
                  sinks: Any = None) -> Any:
    return queries + 0 * (keys[:, :1, :1, :1].sum() + values[:, :1, :1, :1].sum())


def _no_sampler(self: Any, logits: Any, u: Any) -> tuple[Any, Any]:
    import mlx.core as mx

    return mx.argmax(logits, axis=-1).astype(mx.uint32), logits[:, 0]


def _no_kv_write(self: Any, keys: Any, values: Any) -> tuple[Any, Any]:
    return self.state["k"][self.i], self.state["v"][self.i]


@contextlib.contextmanager
def _not_transposed(model: Any) -> Any:
    yield


ABLATIONS = {"attention": ("mlx_rlaif.cpu.decode_kernels", None, "decode_attention",
                           _no_attention),
             "sampler": ("mlx_rlaif.backends.mlx.decode", "Sampler", "draw", _no_sampler),
             "kv_write": ("mlx_rlaif.backends.mlx.compiled_decode", "StaticKV",
                          "update_and_fetch", _no_kv_write),
             "transposed": ("mlx_rlaif.cpu.decode_kernels", None, "_transposed_linears",
                            _not_transposed)}


@contextlib.contextmanager
def _without(model: Any, name: str, steps: dict) -> Any:
    """The compiled loop with part `name` replaced (`whole`: unchanged), decoding with the
    variant's own compiled steps `steps` (traced on first use, kept by the caller); the model's
    own are put back after."""
    import importlib

    key = "_compiled_decode_steps"  # where compiled_decode keeps a model's steps
    own = model.__dict__.pop(key, None)
    model.__dict__[key] = steps
    patch = ABLATIONS.get(name)
    if patch:
        module, cls, attr, stand_in = patch
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        old = getattr(owner, attr)
        setattr(owner, attr, stand_in)
    try:
        yield
    finally:
        if patch:
            setattr(owner, attr, old)
        model.__dict__.pop(key, None)
        if own is not None:
            model.__dict__[key] = own


def paired(a: list[float], b: list[float]) -> dict[str, float]:
    """The ratios of runs made side by side (rep i of `a` over rep i of `b`): median and range,
    robust to a host whose speed drifts between reps."""
    r = [x / y for x, y in zip(a, b, strict=True)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}


def print_profile(key: str, r: dict[str, Any]) -> None:
    p, q = r["piped"], r["sync"]
    print(f"{key}: {p['tokens_per_s']:.0f} tok/s, {p['wall_ms']:.2f} ms/step "
          f"(build {p['build']:.2f}, dispatch {p['dispatch']:.2f}, read {p['read']:.2f}, "
          f"book {p['book']:.2f}) | serialized: host {r['host_ms']:.2f} ms (build "
          f"{q['build']:.2f}, read {q['read']:.2f}, book {q['book']:.2f}), device "
          f"{r['device_ms']:.2f} ms (dispatch {q['dispatch']:.2f}, wait {q['wait']:.2f}): "
          f"host share {r['host_share']:.0%}, device busy {r['device_busy']:.0%}", flush=True)


def print_ablate(key: str, r: dict[str, Any]) -> None:
    parts = ", ".join(f"without {k} {v['median']:.3f}x ({v['min']:.2f}-{v['max']:.2f})"
                      for k, v in r["paired"].items())
    print(f"{key}: whole {r['tokens_per_s']['whole']:.0f} tok/s; paired: {parts}", flush=True)


def print_compare(key: str, r: dict[str, Any]) -> None:
    t, p = r["tokens_per_s"], r["paired"]
    print(f"{key}: tok/s ours {t['ours']:.0f}, eager {t['eager']:.0f}, mlx-lm "
          f"{t['mlx_lm']:.0f}: ours/eager {r['ours_over_eager']:.2f}x, ours/mlx-lm "
          f"{r['ours_over_mlx_lm']:.2f}x; paired medians {p['ours_over_eager']['median']:.2f}x "
          f"and {p['ours_over_mlx_lm']['median']:.2f}x", flush=True)


def machine() -> dict[str, Any]:
    import platform

    import mlx.core as mx

    info: dict[str, Any] = {"device": str(mx.default_device()), "mlx": mx.__version__,
                            "platform": platform.platform(), "cpus": os.cpu_count()}
    with contextlib.suppress(Exception):  # older MLX, or no device info on this backend
        info["device_info"] = {k: str(v) for k, v in mx.device_info().items()}
    return info


def write_json(path: Path, results: dict[str, Any], argv: list[str] | None) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.setdefault("profile_decode", {}).update(results)
    command = "python tools/profile_decode.py " + " ".join(argv or sys.argv[1:])
    runs = data.setdefault("profile_decode_runs", [])
    if not runs or runs[-1]["command"] != command:
        runs.append({"command": command, "machine": machine(), "keys": []})
    runs[-1]["keys"] = sorted({*runs[-1]["keys"], *results})
    path.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
