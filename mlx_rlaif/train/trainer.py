"""Setting up and running a training run: `train(cfg, ...)` checks the inputs, loads the tasks
(less those overlapping `data.decontaminate_against`), the reward, the model and its optimizer,
resumes a checkpoint, evaluates the held-out tasks before and after, and runs the loop
(loop.py; the periodic evaluation is periodic.py). Every check that can fail on user input runs
before anything is written (`prepare`; the memory plan, `memory_plan.resolve`, once the model is
loaded: the run uses the config it resolves).

On `--resume`, the loop state comes from the checkpoint (data cursor, baselines, the KL penalty
the adaptive controller reached). A setting the user changed since the checkpoint wins over the
saved state, with a printed line (`resumed_state`): today that is `rl.kl_penalty`. A damaged
checkpoint is refused (artifacts/integrity.py; the CLI's `--resume` falls back to the one before).
Tasks too long for the model's context are skipped with a line (fit.py). The run's length
(training.max_steps, num_epochs, max_minutes) is length.py's, said in one line at the start;
with several ranks a second line names them (`World.line`).

With several ranks (`world`, distributed.py) every rank runs the same setup and checks; rank 0
alone writes the run directory, and the others restore rank 0's checkpoint from a copy it sends
them; the held-out evaluations are sharded over the ranks.

Not covered: changing the model or LoRA shape on resume (refused by the checkpoint loader).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..artifacts import checkpoint
from ..artifacts.atomic import write_json_atomic, write_text_atomic
from ..artifacts.integrity import problem
from ..backends.ops import OPS
from ..backends.sampling import prompt_formatter
from ..config import Config, dump, prompts_per_step, to_dict
from ..data import TaskOrder, load_tasks
from ..data.curriculum import Curriculum
from ..data.overlap import decontaminate
from ..errors import CheckpointError, ConfigError, DataError
from ..records import Task
from ..rewards.build import build_reward
from ..rewards.custom.contract import record_fields
from ..rewards.exec.cores import Cores
from ..rewards.exec.tasks import check_formats
from .carry import restore_carry
from .distill import load_teacher
from .distributed import World
from .distributed_metrics import SilentHub, check_same_weights, merge_eval
from .evaluate import evaluate_tasks
from .fit import context_length, fit_context
from .laptop import keep_awake, release
from .length import RunLength, run_length
from .loop import loop
from .memory_plan import resolve
from .periodic import eval_subset, resume_history
from .run import CARRY, CURRICULUM, Run
from .step import sample_records

log = logging.getLogger(__name__)
EVAL_FILE = "eval.json"  # held-out evaluations of the run: {"before": {...}, "after": {...}}


def prepare(cfg: Config, run_dir: Path, resume_from: Path | None, world: World | None = None,
            cores: Cores | None = None):
    """All checks that can fail on user input, before anything is written. With several
    ranks, the run directory is rank 0's, and each rank builds its own reward (`rank_config`).
    `cores`: the exec reward's limit beside decoding (`scoring_cores`)."""
    from ..config import check, reward_components, smoke_eval_tasks

    world = world or World()
    check(cfg)
    d = cfg.data
    tasks = load_tasks(d.train_file, d.languages, 0, d.difficulties)
    tasks = decontaminated(tasks, d)[: d.max_tasks or None]
    eval_tasks = load_tasks(d.eval_file, d.languages, smoke_eval_tasks(), d.difficulties) \
        if d.eval_file else []
    if world.rank == 0 and resume_from is None and checkpoint.list_checkpoints(run_dir):
        raise ConfigError(f"output dir {run_dir} already holds a run: pass --resume to continue "
                          "it or choose another --output-dir")
    if world.rank == 0 and resume_from is not None and (why := problem(resume_from)):
        raise CheckpointError(f"{resume_from} is damaged ({why}): resume from an earlier "
                              "checkpoint (--resume picks the newest whole one)")
    trained = {c.kind for c in reward_components(cfg.reward) if c.weight > 0}
    if trained == {"exec"}:  # with another trained component exec's None is left out of the sum
        check_formats(tasks + eval_tasks)
    langs = {t.language for t in tasks + eval_tasks}
    reward_fn = build_reward(world.rank_config(cfg), None if world.rank else run_dir,
                             languages=langs, fields=record_fields(tasks + eval_tasks),
                             cores=cores)
    return tasks, eval_tasks, reward_fn


def scoring_cores(cfg: Config, world: World) -> Cores | None:
    """The exec reward's limit (rewards/exec/cores.py) where reward.exec.workers is 0: this
    rank's cores, and while a group is scored beside decoding the ones decoding leaves free."""
    if cfg.reward.exec.workers:
        return None
    return Cores(world.cores, decode_threads(cfg, world.cores))


def decode_threads(cfg: Config, cores: int) -> int:
    """The cores decoding keeps busy on this rank (`cores` its share): on a GPU (Metal, CUDA)
    the one thread that feeds it; MLX on the CPU its BLAS threads (cpu/blas.py); torch on the
    CPU half the cores, as MLX's."""
    m = cfg.model
    if m.backend == "torch":
        return max(1, cores // 2) if m.device == "cpu" else 1
    from ..cpu import on_cpu
    from ..cpu.blas import default_threads

    if not on_cpu():
        return 1
    env = os.environ.get("OPENBLAS_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else default_threads(cores)


def decontaminated(tasks: list[Task], d: Any) -> list[Task]:
    """The training tasks that do not overlap `data.decontaminate_against` (all of them when it
    is unset); the count dropped goes to the startup log."""
    if not d.decontaminate_against:
        return tasks
    against = load_tasks(d.decontaminate_against)
    kept, matches = decontaminate(tasks, against, d.decontaminate_ngram,
                                  d.decontaminate_threshold)
    fields = Counter(m.field for m in matches)
    log.info("decontamination against %s (%d-grams, threshold %g): dropped %d of %d training "
             "tasks (prompt %d, solution %d, tests %d)", d.decontaminate_against,
             d.decontaminate_ngram, d.decontaminate_threshold, len(tasks) - len(kept), len(tasks),
             fields["prompt"], fields["solution"], fields["tests"])
    if not kept:
        raise DataError(f"every training task overlaps {d.decontaminate_against}: check "
                        "data.decontaminate_against (see `mlx-rlaif data overlap`)")
    return kept


def length_of(cfg: Config, n_tasks: int) -> RunLength:
    """The run's length (length.py) over `n_tasks` training tasks."""
    P = prompts_per_step(cfg)
    per_epoch = TaskOrder(n_tasks, cfg.training.seed).batches_per_epoch(P)
    return run_length(cfg.training, per_epoch, f"the {n_tasks} tasks at {P} prompts a step")


def total_steps(cfg: Config, n_tasks: int) -> int | None:
    """The step the run ends at (None: only training.max_minutes ends it)."""
    return length_of(cfg, n_tasks).steps


def schedule_horizon(cfg: Config, steps: int | None, saved: checkpoint.LoopState | None) -> int:
    """Optimizer updates the learning-rate schedule spans: the run's steps (training.max_steps
    when the task file is cycled) times rl.num_iterations, fixed at the run's first launch
    (saved in its checkpoints), so a resume continues the same schedule whatever
    training.max_steps it is given (checkpoints from before 0.2 carry none: this launch's).
    A run only time-limited has none (0: the check refuses a cosine schedule there)."""
    if saved is not None and saved.total_updates:
        return saved.total_updates
    return (steps or 0) * cfg.rl.num_iterations


def resumed_state(saved: checkpoint.LoopState, cfg: Config, saved_cfg: Config | None,
                  say: Any) -> checkpoint.LoopState:
    """The loop state to continue from: the checkpoint's, except where the user changed a
    setting since (the new value wins, and `say` prints one line saying so)."""
    new, old = cfg.rl.kl_penalty, (saved_cfg.rl.kl_penalty if saved_cfg else None)
    if old is not None and new != old:
        say(f"rl.kl_penalty = {new} (changed since the checkpoint) replaces the saved "
            f"{saved.kl_penalty:g}")
        return replace(saved, kl_penalty=new)
    return saved


def saved_config(ckpt: Path) -> Config | None:
    """The config a checkpoint was written with (None where it has none or it no longer loads)."""
    from ..config import load

    path = Path(ckpt) / "config.yaml"
    try:
        return load(path) if path.is_file() else None
    except ConfigError:
        return None


def train(cfg: Config, resume_from: Path | None = None, interactive: bool = False,
          hub: Any = None, world: World | None = None) -> Path:
    """Run (or resume) training; returns the run directory. `world`: the data-parallel ranks
    this process is one of (distributed.connect; default one process)."""
    world = world or World()
    world.check_engine(cfg.model.backend)
    world.set_timeout(cfg.distributed.timeout_s)
    run_dir = Path(cfg.training.output_dir)
    first_run = kernel_line(cfg)  # read before anything compiles
    cores = scoring_cores(cfg, world)
    tasks, eval_tasks, reward_fn = world.agreed(
        lambda: prepare(cfg, run_dir, resume_from, world, cores), "check of the setup")
    try:  # the reward's worker processes and pools end with a model that does not load
        ops = OPS[cfg.model.backend]()
        policy = ops.load(cfg)
        teacher = load_teacher(cfg, policy)  # distill.kind teacher: loaded once, frozen
    except BaseException:
        reward_fn.close()
        raise
    fit = (prompt_formatter(policy.tokenizer, cfg.model), context_length(policy.model),
           cfg.generation.max_new_tokens)
    tasks, skipped = fit_context(tasks, *fit, "training")
    eval_tasks, eval_skipped = fit_context(eval_tasks, *fit, "held-out")
    try:  # the memory plan: a run that cannot fit stops here
        user_cfg, (cfg, memory_line) = cfg, resolve(cfg, getattr(policy, "model", None),
                                                    tasks + eval_tasks,
                                                    prompt_formatter(policy.tokenizer, cfg.model),
                                                    getattr(teacher, "model", None))
    except ConfigError:
        reward_fn.close()
        raise
    length = length_of(cfg, len(tasks))
    steps = length.steps
    resume_from = world.copy_dir(resume_from)  # rank 0's checkpoint, on every rank
    saved = checkpoint.load_state(resume_from) if resume_from is not None else None
    horizon = schedule_horizon(cfg, steps, saved)
    optimizer = ops.optimizer(policy, cfg, horizon)
    state = checkpoint.LoopState(kl_penalty=cfg.rl.kl_penalty, total_updates=horizon)
    if world.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.clean_partial(run_dir)
    if hub is None and world.rank:
        hub = SilentHub()
    if hub is None:
        from ..metrics import MetricsHub

        hub = MetricsHub.create(cfg.logging, run_dir, interactive, steps or 0, hparams(cfg),
                                resume=resume_from is not None,
                                time_budget_s=60 * length.minutes)
    awake = None
    try:
        awake = keep_awake(cfg.training.prevent_sleep, hub.message)  # macOS (laptop.py)
        for line in filter(None, (skipped, eval_skipped, memory_line, length.line,
                                  world.line(prompts_per_step(cfg),
                                             cfg.generation.num_samples_per_prompt),
                                  first_run)):
            hub.message(line)
        if resume_from is not None:
            state = resumed_state(ops.restore(policy, optimizer, resume_from), cfg,
                                  saved_config(resume_from), hub.message)
            if cfg.training.lr_schedule == "cosine" and \
                    horizon != (steps or 0) * cfg.rl.num_iterations:
                hub.message(f"the learning-rate schedule keeps the horizon of the run's first "
                            f"launch ({horizon} updates), whatever training.max_steps says now")
            state = replace(state, total_updates=horizon)
            hub.message(f"resuming from {resume_from} (step {state.step})")
        if world.rank == 0:  # the user's config: the memory plan is made again on resume
            write_text_atomic(run_dir / "config.yaml", dump(user_cfg))
        run = Run(cfg, ops, policy, optimizer, reward_fn, run_dir, state,
                  prompt_formatter(policy.tokenizer, cfg.model), world=world, cores=cores,
                  teacher=teacher)
        check_same_weights(world, policy)
        d = cfg.data
        if d.curriculum:
            run.curriculum = Curriculum.of(tasks, d.curriculum_by, cfg.training.seed,
                                           d.curriculum_floor, d.curriculum_rate)
        if resume_from is not None:
            restore_sampling(run, resume_from, tasks)
        if eval_tasks and world.first(lambda: "before" not in read_evals(run_dir)):
            held_out_eval(run, eval_tasks, hub, "before")
        periodic_tasks = eval_subset(eval_tasks, cfg.data.eval_max_tasks, cfg.training.seed
                                     ) if cfg.data.eval_every else []
        if resume_from is not None:
            resume_history(run, periodic_tasks, hub)
        loop(run, tasks, steps, hub, periodic_tasks)
        if eval_tasks and run.stop is None:
            held_out_eval(run, eval_tasks, hub, "after")
    finally:
        release(awake)
        reward_fn.close()
        hub.close()
    return run_dir


def restore_sampling(run: Run, ckpt: Path, tasks: list[Task]) -> None:
    """A checkpoint's carried groups (dynamic sampling) and curriculum state, where present."""
    carry = Path(ckpt) / CARRY
    if carry.is_file():
        run.carry = restore_carry(json.loads(carry.read_text()), {t.id: t for t in tasks})
    state = Path(ckpt) / CURRICULUM
    if run.curriculum is not None and state.is_file():
        run.curriculum.restore(json.loads(state.read_text()))


def held_out_eval(run: Run, tasks: list[Task], hub: Any, when: str) -> dict[str, float]:
    """pass@1 and mean reward on the held-out tasks, kept in eval.json under `when`
    ("before" training or "after" it) and reported to the hub."""
    d, records, world = run.cfg.data, [], run.world
    res = evaluate_tasks(run.ops.sample, run.policy, world.share(tasks), run.reward_fn, run.cfg,
                         n=d.eval_samples, seed=world.rank_seed(run.cfg.training.seed),
                         temperature=d.eval_temperature,
                         on_scored=lambda rs, rws: records.extend(
                             sample_records(run.state.step, rs, rws, split="evaluation")),
                         turns=run.cfg.generation.max_turns, converse=run.ops.converse)
    res, records = merge_eval(world, res, records)  # every rank's share (sharded over ranks)
    hub.log_samples(run.state.step, records)
    summary = {"step": run.state.step, "tasks": res["n_tasks"], "samples_per_task": d.eval_samples,
               "temperature": d.eval_temperature, "pass@1": res["pass@1"],
               "reward_mean": res["reward_mean"],
               **{k: res[k] for k in ("pass@1_turn1", "turns_mean") if k in res}}
    evals = {**read_evals(run.run_dir), when: summary}
    if world.rank == 0:
        write_json_atomic(run.run_dir / EVAL_FILE, evals)
    line = (f"held-out eval {when} training ({res['n_tasks']} tasks x {d.eval_samples}, "
            f"T={d.eval_temperature}): pass@1 {res['pass@1']:.3f}, mean reward "
            f"{res['reward_mean']:.3f}")
    if when == "after" and "before" in evals:
        gain = 100 * (res["pass@1"] - evals["before"]["pass@1"])
        line += f" (before: {evals['before']['pass@1']:.3f}, {gain:+.1f} points)"
    hub.message(line)
    return summary


def read_evals(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / EVAL_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def kernel_line(cfg: Config) -> str | None:
    """On MLX's CPU and CUDA builds, a run whose kernel cache is empty says its first steps
    compile kernels, once, and where they are kept (backends/mlx/kernel_cache.py)."""
    if cfg.model.backend != "mlx":
        return None
    import mlx.core as mx

    from ..backends.mlx.device import kind_of
    from ..backends.mlx.kernel_cache import first_run_line

    return first_run_line(kind_of(), mx.__version__)


def hparams(cfg: Config) -> dict:
    """The config flattened to dotted keys (TensorBoard's hparams, the dataset card)."""
    flat: dict = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict) and k != "criteria":
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)

    walk(to_dict(cfg), "")
    return flat
