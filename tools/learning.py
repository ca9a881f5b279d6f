"""The learning protocol of issue 21: does a recipe teach the shipped model medium and hard Python
tasks it did not solve, in the same wall-clock budget as the controls?

    python tools/learning.py prepare                      # once: freeze, split, control data
    python tools/learning.py run ARM --seed S [--minutes 5 | --steps N] [--dtype bfloat16]
                                [--on dev|eval] [--set KEY=VALUE ...]
    python tools/learning.py teacher --minutes 6                 # issue 58: SFT, fuse, evaluate
    python tools/learning.py curve --at 1.5 [--on eval] [--seeds 0] [--budget 3]   # earlier
    python tools/learning.py report [--on eval]

`prepare` records the sha256 of the model's files (the model is frozen: every run starts from
it), carves a dev split out of the training families (one task in eight of each Python
(difficulty, family) bucket of `synthetic-train`; recipes are tuned on it, never on the
evaluated tasks), writes the remaining training tasks, the supervised control's data (their
reference solutions as the model was taught them: the body under the prompt's stub), and
evaluates the frozen model.

`run --set KEY=VALUE` adds an override to an RL arm (recipe tuning on the dev split); the
results name it.

`run` trains one arm from the frozen model for `--minutes` of training (`training.max_minutes`;
model loading and evaluation are not counted), or with `--steps N` for N steps whatever they take
(`training.max_steps`: arms compared at the same number of updates), and evaluates it on the medium and hard Python
tasks of the dev split or of `synthetic-eval` (`--on eval`): pass@1 at T = 0.7 and pass@8 from
16 samples per task, and greedy pass@1, all with evaluation seed 0. Arms:

- `current`: the quickstart recipe on all Python training tasks (`data.difficulties=[]`),
  scoring after decoding: what main trained with before issue 21;
- `new`: configs/full-python.yaml (dynamic sampling, curriculum, off-policy guidance, token
  ratios);
- `no-dynamic`, `no-curriculum`, `no-guidance`: `new` with one of them off; `with-gspo`: with
  GSPO's sequence ratios instead of token ratios;
- `sft`: continued supervised tuning on the training solutions (the control: more of what made
  the model);
- `rft`: rejection-sampling fine-tuning (the other control): sample 8 answers per training task
  from the frozen model for half the budget, keep the passing ones, tune on them for the rest.
- `opd`, `mix`, `self` (issue 58, docs/recipes.md "A target for every token"): full-python's
  recipe with a per-token distillation term. `opd`: on-policy distillation from the teacher
  (`teacher` below) alone: `distill.weight_reward` 0, no KL to the base (the teacher's reverse KL
  is the regularizer, as in configs/distill.yaml), and without dynamic sampling and guidance,
  which act on the exec reward only (the one discards groups whose rewards do not vary, the
  other puts the reference answer in all-fail groups: neither is on-policy distillation).
  `mix`: the `new` arm unchanged plus the teacher's term at `distill.weight_reward` 1 (GRPO's
  advantage at its own scale: mix minus new is the term alone). `self`: the `new` arm plus
  configs/self-distill.yaml's distill section (the policy with the failed tests' report and a
  passing sibling in its context, the term clipped to +-1, `weight_reward` 1).
- `teacher` (a subcommand, not an arm): the `sft` control's training for `--minutes`, fused
  (`mlx-rlaif fuse`) into .bench/learning/teacher, evaluated like an arm (teacher.json); `opd`
  and `mix` need it.
- `sft+rl`: the warm start (docs/sft-then-rl.md): the `sft` control's training for
  `--sft-share` of the minutes (configs/sft-then-rl-sft.yaml with the control's data), its
  adapters evaluated on the same split (`sft/*`: the RL phase's start), then RL from them for
  the rest (configs/sft-then-rl.yaml: full-python's recipe, `lora.init_adapter` the SFT run,
  `rl.reference` initial unless `--set rl.reference=base`); `rl_gain/*` is the RL phase's own
  gain over its SFT start. The name carries the share (`sft+rl+share=0.67`). `sft+rl+self`:
  the same with `self`'s distill section in the RL phase; `sft+rl+mix` with `mix`'s (the
  teacher's term beside GRPO's advantage).

`--dtype bfloat16` (or float16) runs an arm on the frozen model converted to that dtype
(`mlx-rlaif convert --dtype`, once, into .bench/learning/model-DTYPE; the weights MLX computes
in, as on Apple silicon): trained and evaluated in it, its gains measured against that model
evaluated before training (frozen-DTYPE.json, evaluated once). Issue 37's protocol:
`run new --steps N --dtype bfloat16 [--set rl.is_correction=tis]` for seeds 0-2.

SFT's own curve: `run sft --minutes M` for M = 3, 6, 15.

`run --save-every N` keeps a checkpoint every N steps; `curve --at M` then evaluates, for the
latest run of every arm and seed on the split, the checkpoint whose training time (the sum of
its steps' time/step) is nearest M minutes, once (curve.jsonl): the arms over time.

Results append to .bench/learning/results.jsonl; `report` prints the table (mean and range over
seeds of the gain in points over the frozen model, one row per arm and budget), the RL phase's
own gain of `sft+rl` arms, and each `sft+rl` arm paired by seed with the `sft` control of the
same minutes.

Not covered: other models, languages or suites; runs longer than this machine's budget.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

WORK = ROOT / ".bench" / "learning"
MODEL = "builtin:tiny-coder"
LEVELS = "medium,hard"
EVAL_SEED = 0
SAMPLES = 16  # per task, T = 0.7: pass@1 and pass@8
RECIPE = ROOT / "configs" / "full-python.yaml"
WARM_SFT = ROOT / "configs" / "sft-then-rl-sft.yaml"  # the sft+rl arm's two phases
WARM_RL = ROOT / "configs" / "sft-then-rl.yaml"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
TEACHER = WORK / "teacher"  # `teacher`: the SFT control's training, fused
TEACHER_TERM = ["distill.kind=teacher", f"distill.teacher={TEACHER}", "distill.coef=1.0"]
SELF_TERM = ["distill.kind=self", "distill.self_adapters=policy",
             "distill.self_context=[feedback, sibling]", "distill.coef=1.0", "distill.clip=1.0",
             "distill.weight_reward=1.0"]  # configs/self-distill.yaml's distill section
DISTILL = {"opd": [*TEACHER_TERM, "distill.weight_reward=0", "rl.kl_penalty=0",
                   "rl.dynamic_sampling=false", "rl.guidance=false"],
           "mix": [*TEACHER_TERM, "distill.weight_reward=1.0"],
           "self": SELF_TERM, "sft+rl+self": SELF_TERM,
           "sft+rl+mix": [*TEACHER_TERM, "distill.weight_reward=1.0"]}
WARM = ("sft+rl", "sft+rl+self", "sft+rl+mix")
NEEDS_TEACHER = ("opd", "mix", "sft+rl+mix")
ABLATIONS = {"no-dynamic": ["rl.dynamic_sampling=false"],
             "no-curriculum": ["data.curriculum=false"],
             "no-guidance": ["rl.guidance=false"],
             "with-gspo": ["rl.ratio_level=sequence"]}


def cli(*args: str, log: Path | None = None) -> None:
    """Run `mlx-rlaif ARGS` (the installed package, OpenBLAS preloaded as the CLI does)."""
    cmd = [sys.executable, "-m", "mlx_rlaif.cli", *args]
    out = log.open("w") if log is not None else None
    try:
        proc = subprocess.run(cmd, stdout=out or subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=ROOT)
    finally:
        if out is not None:
            out.close()
    if proc.returncode != 0:
        tail = log.read_text()[-3000:] if log is not None else proc.stdout[-3000:]
        raise SystemExit(f"mlx-rlaif {' '.join(args[:1])} failed ({proc.returncode}):\n{tail}")


def model_hash() -> dict[str, str]:
    from mlx_rlaif.assets import resolve_model

    root = Path(resolve_model(MODEL))
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.iterdir()) if p.is_file() and p.suffix in
            {".safetensors", ".json"}}


def answer_body(task: dict) -> str:
    """The supervised answer as the model was taught it (tools/make_tiny_model.answer_text)."""
    from make_tiny_model import answer_text

    return answer_text(task)


def split_train(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(train, dev): one task in eight of each Python (difficulty, family) bucket, chosen by a
    CRC of its id, goes to dev (at least one per bucket of two or more)."""
    buckets: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r["language"] == "python":
            buckets.setdefault((r["difficulty"], r["family"]), []).append(r)
    train, dev = [], []
    for rs in buckets.values():
        ranked = sorted(rs, key=lambda r: zlib.crc32(r["id"].encode()))
        k = max(1, len(rs) // 8) if len(rs) > 1 else 0
        dev += ranked[:k]
        train += ranked[k:]
    return train, dev


def evaluate(adapter: Path | None, on: str, tag: Path, model: str = MODEL) -> dict[str, float]:
    """pass@1 (T = 0.7) and pass@8 from 16 samples per task, and greedy pass@1."""
    suite = str(WORK / "dev.jsonl") if on == "dev" else "synthetic-eval"
    base = ["eval", "--model", model, "--suite", suite, "--languages", "python",
            "--difficulties", LEVELS, "--seed", str(EVAL_SEED)]
    if adapter is not None:
        base += ["--adapter", str(adapter)]
    res = {}
    for name, extra in (("sampled", ["-n", str(SAMPLES), "--temperature", "0.7"]),
                        ("greedy", ["-n", "1", "--temperature", "0"])):
        out = tag.with_name(f"{tag.name}-{name}.jsonl")
        cli(*base, *extra, "--out", str(out), log=out.with_suffix(".log"))
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        from mlx_rlaif.train.evaluate import summarize

        s = summarize(rows, int(extra[1]), [1, 8])
        if name == "sampled":
            res.update({"pass@1": s["pass@1"], "pass@8": s["pass@8"]})
        else:
            res["greedy"] = s["pass@1"]
    res["tasks"] = len(rows)
    return res


def prepare(args: argparse.Namespace) -> int:
    from mlx_rlaif.data.suites import load_suite

    WORK.mkdir(parents=True, exist_ok=True)
    train, dev = split_train(list(load_suite("synthetic-train")))
    for name, rows in (("train", train), ("dev", dev)):
        (WORK / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (WORK / "sft.jsonl").write_text("".join(
        json.dumps({"prompt": r["prompt"], "completion": answer_body(r)}) + "\n" for r in train))
    frozen = {"model": MODEL, "sha256": model_hash(), "train": len(train), "dev": len(dev),
              "dev_medium_hard": sum(r["difficulty"] != "easy" for r in dev)}
    for on in ("dev", "eval"):
        frozen[f"before_{on}"] = evaluate(None, on, WORK / f"before-{on}")
    (WORK / "frozen.json").write_text(json.dumps(frozen, indent=2))
    print(json.dumps(frozen, indent=2))
    return 0


def model_path(dtype: str) -> str:
    """The frozen model in `dtype`: the shipped one (float32), else converted once."""
    if dtype == "float32":
        return MODEL
    out = WORK / f"model-{dtype}"
    if not (out / "config.json").is_file():
        from mlx_rlaif.assets import resolve_model

        cli("convert", "--hf-path", resolve_model(MODEL), "--mlx-path", str(out), "--dtype",
            dtype, log=WORK / f"model-{dtype}.log")
    return str(out)


def before(on: str, dtype: str, frozen: dict) -> dict:
    """The frozen model's scores on `on` in `dtype` (float32: prepare's; else evaluated once)."""
    if dtype == "float32":
        return frozen[f"before_{on}"]
    path = WORK / f"frozen-{dtype}.json"
    scores = json.loads(path.read_text()) if path.is_file() else {}
    if on not in scores:
        scores[on] = evaluate(None, on, WORK / f"before-{on}-{dtype}", model_path(dtype))
        path.write_text(json.dumps(scores, indent=2))
    return scores[on]


def train_rl(arm: str, seed: int, budget: tuple[float, int], out: Path, extra: list[str],
             dtype: str = "float32", save_every: int = 0) -> None:
    """One RL arm for `budget` = (minutes, steps): steps when above 0, else minutes; a
    checkpoint every `save_every` steps (0: the last only)."""
    recipe = WARM_RL if arm in WARM else {"current": QUICKSTART}.get(arm, RECIPE)
    if arm in NEEDS_TEACHER and not (TEACHER / "config.json").is_file():
        raise SystemExit("no teacher: run `python tools/learning.py teacher` first")
    sets = {"current": ["data.difficulties=[]", "generation.score_while_decoding=false"],
            "new": [], "sft+rl": [], **ABLATIONS, **DISTILL}[arm] + extra
    minutes, steps = budget
    args = ["train", "--config", str(recipe), "--output-dir", str(out), "--no-dashboard",
            "--set", f"model.path={model_path(dtype)}",
            "--set", f"data.train_file={WORK / 'train.jsonl'}", "--set", "data.eval_file=",
            "--set", f"training.seed={seed}",
            "--set", f"training.max_minutes={0 if steps else minutes}",
            "--set", f"training.max_steps={steps}", "--set", "training.num_epochs=100",
            "--set", f"training.save_every_batches={save_every}",
            "--set", f"training.save_total_limit={0 if save_every else 1}",
            "--set", "logging.tensorboard=false"]
    for s in sets:
        args += ["--set", s]
    cli(*args, log=out.with_name(out.name + ".log"))


def train_sft(data: Path, seed: int, minutes: float, out: Path,
              config: Path = ROOT / "configs" / "sft.yaml", save_every: int = 0) -> None:
    """The supervised control's training on `data` (prompt/completion records); a checkpoint
    every `save_every` steps (0: the last only)."""
    cli("sft", "--config", str(config), "--set", f"model.path={MODEL}",
        "--set", f"sft.train_file={data}", "--set", "sft.completion_key=completion",
        "--set", f"training.output_dir={out}",
        "--set", f"training.seed={seed}", "--set", f"training.max_minutes={minutes}",
        "--set", "training.num_epochs=100", "--set", "training.batch_size=16",
        "--set", "training.learning_rate=2.0e-4", "--set", "training.save_every_epochs=0",
        "--set", f"training.save_every_batches={save_every}",
        "--set", f"training.save_total_limit={0 if save_every else 1}",
        log=out.with_name(out.name + ".log"))


def rejection_samples(seed: int, seconds: float, out: Path) -> Path:
    """Passing answers of the frozen model on the training tasks, 8 per task, sampled in chunks
    of 64 tasks until `seconds` have passed; written as SFT records."""
    tasks = [json.loads(x) for x in (WORK / "train.jsonl").read_text().splitlines()]
    order = sorted(tasks, key=lambda r: zlib.crc32(f"{seed}:{r['id']}".encode()))
    kept, tic = [], time.monotonic()
    for i in range(0, len(order), 64):
        chunk = out.parent / f"{out.name}-chunk.jsonl"
        chunk.write_text("".join(json.dumps(r) + "\n" for r in order[i:i + 64]))
        res = out.parent / f"{out.name}-sampled.jsonl"
        cli("eval", "--model", MODEL, "--suite", str(chunk), "-n", "8", "--temperature", "1.0",
            "--max-new-tokens", "64", "--seed", str(seed + i), "--out", str(res),
            log=res.with_suffix(".log"))
        by_id = {r["id"]: r for r in order[i:i + 64]}
        for row in map(json.loads, res.read_text().splitlines()):
            kept += [{"prompt": by_id[row["id"]]["prompt"], "completion": c}
                     for c, ok in zip(row["completions"], row["passed"], strict=True) if ok]
        if time.monotonic() - tic >= seconds:
            break
    data = out.parent / f"{out.name}-kept.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in kept))
    print(f"rft: kept {len(kept)} passing answers in {time.monotonic() - tic:.0f} s")
    return data


def run(args: argparse.Namespace) -> int:
    if not (WORK / "frozen.json").is_file():
        raise SystemExit("run `python tools/learning.py prepare` first")
    frozen = json.loads((WORK / "frozen.json").read_text())
    if frozen["sha256"] != model_hash():
        raise SystemExit("the model changed since `prepare`: prepare again (a new frozen model)")
    share = [f"share={args.sft_share:g}"] if args.arm in WARM else []
    name = "+".join([args.arm, *share, *args.set]) + (
        "" if args.dtype == "float32" else f"@{args.dtype}")
    budget = f"{args.steps}steps" if args.steps else f"{args.minutes:g}min"
    # the budget in the name: a run of another budget (its checkpoints, for `curve`) is kept
    out = WORK / "runs" / f"{name.replace('/', '_')}-{budget}-s{args.seed}-{args.on}"
    out.parent.mkdir(parents=True, exist_ok=True)
    for p in out.parent.glob(f"{out.name}*"):
        subprocess.run(["rm", "-rf", str(p)], check=True)
    if args.steps and args.arm in ("sft", "rft", *WARM):
        raise SystemExit("--steps counts RL updates: give the sft, rft and sft+rl arms --minutes")
    if args.arm in WARM and not 0 < args.sft_share < 1:
        raise SystemExit("--sft-share is the SFT phase's share of --minutes: between 0 and 1")
    if args.dtype != "float32" and args.arm in ("sft", "rft", *WARM):
        raise SystemExit("--dtype is for the RL arms: the controls run on the shipped model")
    tic, phase = time.monotonic(), {}
    if args.arm == "sft":
        train_sft(WORK / "sft.jsonl", args.seed, args.minutes, out, save_every=args.save_every)
    elif args.arm in WARM:
        phase = warm_start(args, out, frozen)
    elif args.arm == "rft":
        half = 60 * args.minutes / 2
        t0 = time.monotonic()
        data = rejection_samples(args.seed, half, out)
        train_sft(data, args.seed, max(args.minutes - (time.monotonic() - t0) / 60, 0.1), out)
    else:
        train_rl(args.arm, args.seed, (args.minutes, args.steps), out, args.set, args.dtype,
                 args.save_every)
    wall = time.monotonic() - tic - phase.pop("eval_s", 0.0)  # the SFT phase's eval not counted
    after = evaluate(out, args.on, out, model_path(args.dtype))
    start = before(args.on, args.dtype, frozen)
    row = {"arm": name, "seed": args.seed, "on": args.on, "dtype": args.dtype,
           "minutes": None if args.steps else args.minutes, "max_steps": args.steps,
           "run_dir": str(out.relative_to(WORK)),
           "wall_s": round(wall, 1), "steps": _steps(out), **_agreement(out),
           **{f"after/{k}": v for k, v in after.items()},
           **{f"gain/{k}": round(100 * (after[k] - start[k]), 1)
              for k in ("pass@1", "pass@8", "greedy")}, **phase}
    if phase:
        row.update({f"rl_gain/{k}": round(100 * (after[k] - phase[f"sft/{k}"]), 1)
                    for k in ("pass@1", "pass@8", "greedy")})
    with (WORK / "results.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return 0


def teacher(args: argparse.Namespace) -> int:
    """The distillation teacher as a user builds one: the `sft` control's training for
    `--minutes`, fused into a model directory (TEACHER), evaluated on `--on` like an arm."""
    frozen = json.loads((WORK / "frozen.json").read_text())
    sft_out = WORK / "teacher-sft"
    for p in (sft_out, TEACHER):
        subprocess.run(["rm", "-rf", str(p)], check=True)
    tic = time.monotonic()
    train_sft(WORK / "sft.jsonl", args.seed, args.minutes, sft_out)
    wall = time.monotonic() - tic
    cli("fuse", str(sft_out), "--out", str(TEACHER), log=WORK / "teacher-fuse.log")
    after = evaluate(None, args.on, WORK / f"teacher-{args.on}", str(TEACHER))
    b = frozen[f"before_{args.on}"]
    row = {"minutes": args.minutes, "seed": args.seed, "on": args.on, "wall_s": round(wall, 1),
           "steps": _sft_steps(sft_out), **{f"after/{k}": v for k, v in after.items()},
           **{f"gain/{k}": round(100 * (after[k] - b[k]), 1) for k in KEYS}}
    (WORK / "teacher.json").write_text(json.dumps(row, indent=2))
    print(json.dumps(row))
    return 0


def curve(args: argparse.Namespace) -> int:
    """Evaluate, for the latest run of every arm and seed on `--on` that kept checkpoints, the
    one whose training time is nearest `--at` minutes (once per run and point: curve.jsonl)."""
    path = WORK / "curve.jsonl"
    done = {(r["run_dir"], r["at"]) for r in map(json.loads, path.read_text().splitlines())} \
        if path.is_file() else set()
    rows = [json.loads(x) for x in (WORK / "results.jsonl").read_text().splitlines()]
    b = json.loads((WORK / "frozen.json").read_text())[f"before_{args.on}"]
    for (arm, budget), seeds in latest_by_seed([r for r in rows if r["on"] == args.on]).items():
        for seed, r in sorted(seeds.items()):
            if (args.seeds and seed not in args.seeds
                    or args.budget and budget != f"{args.budget:g} min"):
                continue
            if "run_dir" not in r or (r["run_dir"], args.at) in done:
                continue
            if _steps(WORK / r["run_dir"]) != r.get("steps"):  # a later run took its folder
                print(f"{r['run_dir']}: holds another run now, not this row's; skipped")
                continue
            found = nearest_checkpoint(WORK / r["run_dir"], 60 * args.at)
            if found is None:
                continue
            ckpt, seconds, step = found
            (WORK / "curve").mkdir(exist_ok=True)
            after = evaluate(ckpt, args.on, WORK / "curve" / f"{ckpt.parent.parent.name}-{step}")
            row = {"arm": arm, "budget": budget, "seed": seed, "run_dir": r["run_dir"],
                   "at": args.at, "train_s": round(seconds, 1), "step": step,
                   **{f"after/{k}": after[k] for k in KEYS},
                   **{f"gain/{k}": round(100 * (after[k] - b[k]), 1) for k in KEYS}}
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row))
    return 0


def nearest_checkpoint(run_dir: Path, seconds: float) -> tuple[Path, float, int] | None:
    """(checkpoint, training seconds at it, step): the kept checkpoint whose summed time/step
    is nearest `seconds`, the final one left out (it is the arm's own row); None if none."""
    from mlx_rlaif.artifacts.checkpoint import checkpoint_step, list_checkpoints

    path = run_dir / "batches.jsonl"
    if not path.is_file():
        return None
    elapsed, total = {}, 0.0
    for m in map(json.loads, path.read_text().splitlines()):
        if isinstance(m.get("time/step"), (int, float)) and "step" in m:
            total += m["time/step"]
            elapsed[int(m["step"])] = total
    kept = [(c, elapsed[checkpoint_step(c)], checkpoint_step(c))
            for c in list_checkpoints(run_dir)[:-1] if checkpoint_step(c) in elapsed]
    return min(kept, key=lambda k: abs(k[1] - seconds)) if kept else None


def warm_start(args: argparse.Namespace, out: Path, frozen: dict) -> dict:
    """The sft+rl arm's SFT phase (`--sft-share` of the minutes, the control's data and
    settings) and its evaluation on the same split, then RL from its adapters for the rest.
    Returns the SFT phase's scores (`sft/*`, `sft_gain/*`), the phases' minutes and the seconds
    its evaluation took (`eval_s`, not training time)."""
    sft_minutes = args.minutes * args.sft_share
    sft_out = out.with_name(out.name + "-sft")
    train_sft(WORK / "sft.jsonl", args.seed, sft_minutes, sft_out, WARM_SFT)
    t0 = time.monotonic()
    start = evaluate(sft_out, args.on, sft_out)
    eval_s = time.monotonic() - t0
    train_rl(args.arm, args.seed, (args.minutes - sft_minutes, 0), out,
             [f"lora.init_adapter={sft_out}", *args.set])
    b = frozen[f"before_{args.on}"]
    return {"sft_minutes": sft_minutes, "rl_minutes": args.minutes - sft_minutes,
            "sft_steps": _sft_steps(sft_out), "eval_s": eval_s,
            **{f"sft/{k}": start[k] for k in ("pass@1", "pass@8", "greedy")},
            **{f"sft_gain/{k}": round(100 * (start[k] - b[k]), 1)
               for k in ("pass@1", "pass@8", "greedy")}}


def _sft_steps(out: Path) -> int:
    path = out / "batches.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    return sum("loss/sft" in r for r in rows)


def _agreement(out: Path) -> dict[str, float]:
    """The run's mean policy/sampler_kl and policy/sampler_far_frac over its steps."""
    path = out / "batches.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    res = {}
    for key in ("policy/sampler_kl", "policy/sampler_far_frac"):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if vals:
            res[key] = sum(vals) / len(vals)
    return res


def _steps(out: Path) -> int:
    lines = (out / "batches.jsonl").read_text().splitlines() if (out / "batches.jsonl").is_file() \
        else []
    return len([x for x in lines if '"step"' in x])


KEYS = ("pass@1", "pass@8", "greedy")


def report(args: argparse.Namespace) -> int:
    frozen = json.loads((WORK / "frozen.json").read_text())
    rows = [json.loads(x) for x in (WORK / "results.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["on"] == args.on]
    b = frozen[f"before_{args.on}"]
    print(f"frozen model: pass@1 {b['pass@1']:.3f}, pass@8 {b['pass@8']:.3f}, greedy "
          f"{b['greedy']:.3f} on {b['tasks']} {args.on} medium+hard Python tasks")
    arms = latest_by_seed(rows)
    teach = json.loads((WORK / "teacher.json").read_text()) if (WORK / "teacher.json").is_file() \
        else None
    if teach and teach["on"] == args.on:
        print(f"teacher (sft {teach['minutes']:g} min, {teach['steps']} steps, fused): pass@1 "
              f"{teach['after/pass@1']:.3f}, pass@8 {teach['after/pass@8']:.3f}, greedy "
              f"{teach['after/greedy']:.3f} (gains {teach['gain/pass@1']:+.1f}, "
              f"{teach['gain/pass@8']:+.1f}, {teach['gain/greedy']:+.1f})")
    print("| arm | budget | seeds | steps | pass@1 gain (T=0.7) | pass@8 gain | greedy pass@1 "
          "gain |")
    print("|---|---|---|---|---|---|---|")
    for (arm, budget), rs in arms.items():
        steps = "/".join(str(r["steps"]) for r in rs.values())
        cells = [spread([r[f"gain/{k}"] for r in rs.values()]) for k in KEYS]
        print(f"| {arm} | {budget} | {','.join(map(str, rs))} | {steps} | "
              + " | ".join(cells) + " |")
    report_distill(arms, teach)
    warm = {key: rs for key, rs in arms.items() if key[0].startswith("sft+rl")}
    if warm:
        print("\nsft+rl: the SFT phase's gain over the frozen model, the RL phase's own gain "
              "over its SFT start (points)")
        print("| arm | budget | SFT pass@1 | RL phase pass@1 | RL phase pass@8 | RL phase greedy |")
        print("|---|---|---|---|---|---|")
        for (arm, budget), rs in warm.items():
            cells = [spread([r["sft_gain/pass@1"] for r in rs.values()]),
                     *(spread([r[f"rl_gain/{k}"] for r in rs.values()]) for k in KEYS)]
            print(f"| {arm} | {budget} | " + " | ".join(cells) + " |")
        print("\nsft+rl minus the sft control of the same minutes, paired by seed (points)")
        print("| arm | budget | seeds | pass@1 | pass@8 | greedy | seeds at or above the "
              "control (pass@1) |")
        print("|---|---|---|---|---|---|---|")
        for (arm, budget), rs in warm.items():
            control = arms.get(("sft", budget), {})
            seeds = [s for s in rs if s in control]
            if not seeds:
                continue
            diffs = {k: [rs[s][f"gain/{k}"] - control[s][f"gain/{k}"] for s in seeds]
                     for k in KEYS}
            print(f"| {arm} | {budget} | {','.join(map(str, seeds))} | "
                  + " | ".join(spread(diffs[k]) for k in KEYS)
                  + f" | {sum(d >= 0 for d in diffs['pass@1'])}/{len(seeds)} |")
    return 0


def report_distill(arms: dict[tuple[str, str], dict[int, dict]], teach: dict | None) -> None:
    """Issue 58's tables: each arm's pass@1 as a fraction of the teacher's and its curve
    (curve.jsonl: the earlier points, then the end), and the distillation arms' distill/kl over
    the first and the last ten steps."""
    path = WORK / "curve.jsonl"
    points = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    if not points:
        return
    print("\nover time: pass@1 and greedy gains at the checkpoint nearest each point (training "
          "minutes: mean over seeds), and pass@1 as a share of the teacher's")
    print("| arm | budget | point | seeds | minutes | pass@1 gain | greedy gain | pass@1 / "
          "teacher |")
    print("|---|---|---|---|---|---|---|---|")
    for (arm, budget), rs in arms.items():
        got = [p for p in points if p["arm"] == arm and p["budget"] == budget]
        at = sorted({p["at"] for p in got})
        rows = [(f"{a:g} min", [p for p in got if p["at"] == a]) for a in at]
        if not rows:
            continue
        end = [{**r, "train_s": _train_seconds(WORK / r["run_dir"])
                if _steps(WORK / r["run_dir"]) == r.get("steps") else 60 * (r["minutes"] or 0)}
               for r in rs.values()]  # a folder a later run took: the budget's minutes
        for label, ps in [*rows, ("end", end)]:
            shares = [p["after/pass@1"] / teach["after/pass@1"] for p in ps] if teach else []
            share = (f"{sum(shares) / len(shares):.0%}" + (
                f" ({min(shares):.0%} to {max(shares):.0%})" if len(shares) > 1 else "")
                if shares else "-")
            mins = sum(p["train_s"] for p in ps) / len(ps) / 60
            print(f"| {arm} | {budget} | {label} | {','.join(str(p['seed']) for p in ps)} | "
                  f"{mins:.1f} | {spread([p['gain/pass@1'] for p in ps])} | "
                  f"{spread([p['gain/greedy'] for p in ps])} | {share} |")
    kls = {key: [_kl_ends(WORK / r["run_dir"]) for r in rs.values() if "run_dir" in r
                 and _steps(WORK / r["run_dir"]) == r.get("steps")] for key, rs in arms.items()}
    kls = {key: [k for k in v if k] for key, v in kls.items()}
    if any(kls.values()):
        print("\ndistill/kl (mean per-token reverse KL to the target), first and last ten steps")
        print("| arm | budget | seeds | first | last |")
        print("|---|---|---|---|---|")
        for (arm, budget), ks in kls.items():
            if ks:
                print(f"| {arm} | {budget} | {len(ks)} | "
                      f"{sum(k[0] for k in ks) / len(ks):.3f} | "
                      f"{sum(k[1] for k in ks) / len(ks):.3f} |")


def _train_seconds(run_dir: Path) -> float:
    path = run_dir / "batches.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    return sum(r["time/step"] for r in rows if isinstance(r.get("time/step"), (int, float)))


def _kl_ends(run_dir: Path) -> tuple[float, float] | None:
    path = run_dir / "batches.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    kl = [r["distill/kl"] for r in rows if isinstance(r.get("distill/kl"), (int, float))]
    return (sum(kl[:10]) / len(kl[:10]), sum(kl[-10:]) / len(kl[-10:])) if kl else None


def latest_by_seed(rows: list[dict]) -> dict[tuple[str, str], dict[int, dict]]:
    """(arm, budget) -> seed -> its latest row; the budget is `N min` or `N steps`."""
    out: dict[tuple[str, str], dict[int, dict]] = {}
    for r in rows:
        budget = f"{r['max_steps']} steps" if r.get("max_steps") else f"{r['minutes']:g} min"
        out.setdefault((r["arm"], budget), {})[r["seed"]] = r
    return out


def spread(values: list[float]) -> str:
    """The mean, and the range where there are several."""
    mean = sum(values) / len(values)
    return (f"{mean:+.1f} ({min(values):+.1f} to {max(values):+.1f})" if len(values) > 1
            else f"{mean:+.1f}")


def main() -> int:
    os.environ.setdefault("PYTHONHASHSEED", "0")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare")
    r = sub.add_parser("run")
    r.add_argument("arm", choices=["current", "new", "sft", "rft", "sft+rl", *ABLATIONS,
                                   *DISTILL])
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--minutes", type=float, default=5.0)
    r.add_argument("--steps", type=int, default=0,
                   help="train the RL arm for this many steps instead of --minutes")
    r.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="the frozen model converted to this dtype (RL arms)")
    r.add_argument("--on", choices=["dev", "eval"], default="dev")
    r.add_argument("--sft-share", type=float, default=0.67,
                   help="sft+rl: the SFT phase's share of --minutes (the rest is RL)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an RL arm's extra config override (tuning on dev); named in the results")
    r.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="keep a checkpoint every N steps (for `curve`); 0: the last only")
    t = sub.add_parser("teacher")
    t.add_argument("--minutes", type=float, default=6.0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--on", choices=["dev", "eval"], default="eval")
    c = sub.add_parser("curve")
    c.add_argument("--at", type=float, required=True, help="minutes of training")
    c.add_argument("--on", choices=["dev", "eval"], default="eval")
    c.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[],
                   help="only these seeds (comma-separated); default all")
    c.add_argument("--budget", type=float, default=0.0, metavar="MINUTES",
                   help="only the runs of this --minutes budget; default all")
    rep = sub.add_parser("report")
    rep.add_argument("--on", choices=["dev", "eval"], default="eval")
    args = p.parse_args()
    return {"prepare": prepare, "run": run, "report": report, "teacher": teacher,
            "curve": curve}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
