"""The configuration schema: small frozen dataclasses, one per concern, every field with its
documentation (`metadata["doc"]`) and an optional range check (`opt`).

Not covered: loading (loading.py), the seed trainer's layout (seed.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal


def opt(default: Any, doc: str, check: Any = None, hint: str = "") -> Any:
    """A config field with its documentation and an optional range check."""
    meta = {"doc": doc, "check": check, "hint": hint}
    if isinstance(default, (list, dict, tuple)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def _pos(v: float) -> bool:
    return v > 0


def _nonneg(v: float) -> bool:
    return v >= 0


def _unit(v: float) -> bool:
    return 0 <= v <= 1


@dataclass(frozen=True)
class ModelConfig:
    path: str = opt("builtin:tiny-coder", "Model to train: a local directory mlx-lm loads (HF "
                    "layout or MLX-converted, quantized included), a hub id (needs network), or "
                    "builtin:tiny-coder (the tiny model shipped with the package).")
    quantize: int = opt(0, "Quantize the base model's weights to this many bits at load (4 or 8; "
                        "0: as stored): QLoRA, adapters trained on the quantized layers. A model "
                        "already quantized (`mlx-rlaif convert -q`) is used as it is.",
                        lambda v: v in (0, 4, 8), "use 0, 4 or 8")
    trust_remote_code: bool = opt(False, "Allow custom model code shipped with a hub model.")
    chat_template: bool = opt(True, "Wrap prompts in the tokenizer's chat template when it has one.")
    system_prompt: str = opt("", "Optional system message put before each prompt.")
    backend: Literal["mlx", "torch"] = opt("mlx", "mlx (Apple silicon; CPU on Linux) or torch, "
                                           "the fallback on transformers + PEFT for CUDA (then "
                                           "MPS, CPU): pip install 'mlx-rlaif[torch]'.")
    device: str = opt("", "torch backend only: cuda, cuda:1, mps or cpu (empty: the best found).")
    wired_limit_gb: float = opt(0.0, "MLX only: memory Metal keeps wired (resident) for the run, "
                                "in GB (mx.set_wired_limit); 0: on Metal the run's memory budget "
                                "(training.max_memory_gb or 85% of the recommended working set), "
                                "no effect elsewhere. Over the Mac's limit is refused (raise it "
                                "with sudo sysctl iogpu.wired_limit_mb; `doctor` shows both).",
                                _nonneg)
    cache_limit_gb: float = opt(0.0, "MLX only: the most MLX's buffer cache keeps of freed "
                                "memory for reuse, in GB (mx.set_cache_limit); 0: on Metal what "
                                "the memory plan leaves of the budget (at least 10% of it), "
                                "elsewhere MLX's default.", _nonneg)


@dataclass(frozen=True)
class LoraConfig:
    rank: int = opt(8, "LoRA rank.", _pos)
    scale: float = opt(20.0, "LoRA scale (mlx-lm's `scale`; alpha/rank in other tools).", _pos)
    dropout: float = opt(0.0, "LoRA dropout. Keep 0 for RL: dropout breaks policy/reference "
                         "and sampler/trainer agreement.", lambda v: 0 <= v < 1)
    num_layers: int = opt(-1, "How many of the last transformer blocks get adapters (-1: all).",
                          lambda v: v == -1 or v > 0, "use -1 for all layers or a positive count")
    keys: tuple[str, ...] = opt((), "Module keys inside a block to adapt, e.g. "
                                "[self_attn.q_proj, self_attn.v_proj]; empty: every linear layer.")
    init_adapter: str = opt("", "Start from these adapters (a checkpoint or run directory, e.g. "
                            "from `mlx-rlaif sft`); rl.reference initial makes them the KL "
                            "reference (docs/sft-then-rl.md).")


@dataclass(frozen=True)
class DataConfig:
    train_file: str = opt("suite:synthetic-train", "Training tasks: a JSONL file, a Parquet file "
                          "or datasets.save_to_disk folder of task records, or a shipped suite "
                          "(suite:synthetic-train, suite:synthetic-eval, suite:humaneval).")
    eval_file: str = opt("", "Held-out tasks (the same kinds of source as train_file), evaluated "
                         "before training and at the end of the run (pass@1 and mean reward, in "
                         "eval.json; optional).")
    eval_every: int = opt(0, "Also evaluate the held-out tasks every N steps (0: off): pass@1 and "
                          "mean reward to eval.jsonl, TensorBoard (eval/*) and the dashboard.",
                          _nonneg)
    eval_max_tasks: int = opt(0, "The periodic evaluation uses at most this many held-out tasks, "
                              "the same seeded subset each time (0: all).", _nonneg)
    eval_samples: int = opt(1, "Completions sampled per held-out task (pass@1 averages them).",
                            _pos)
    eval_temperature: float = opt(0.7, "Sampling temperature of the held-out evaluations.",
                                  _nonneg)
    shuffle: bool = opt(True, "Shuffle the training tasks each epoch (deterministic from the seed).")
    languages: tuple[str, ...] = opt((), "Keep only tasks in these languages; empty: all.")
    difficulties: tuple[str, ...] = opt((), "Keep only tasks with these `difficulty` tags (e.g. "
                                        "[easy, medium]); empty: all.")
    max_tasks: int = opt(0, "Use at most this many training tasks (0: all).", _nonneg)
    curriculum: bool = opt(False, "Draw prompts from buckets of tasks (curriculum_by) with "
                           "probability p (1 - p) + curriculum_floor, p a bucket's recent pass "
                           "rate: most from the buckets neither always failed nor always solved. "
                           "Off: each epoch visits every task once, shuffled.")
    curriculum_by: tuple[str, ...] = opt(("difficulty", "family"), "Task fields that make a "
                                         "bucket: difficulty, and/or fields of the task record "
                                         "(family).")
    curriculum_floor: float = opt(0.05, "Weight every bucket keeps, so none starves.", _nonneg)
    curriculum_rate: float = opt(0.3, "EMA rate of a bucket's pass rate per step it is seen.",
                                 _unit)
    decontaminate_against: str = opt("", "Drop the training tasks that overlap these tasks (a task "
                                     "file or suite:NAME; usually the eval set): n-gram overlap of "
                                     "prompts or reference solutions, or equal tests (see "
                                     "`mlx-rlaif data overlap`).")
    decontaminate_ngram: int = opt(8, "Tokens per n-gram of the decontamination.", _pos)
    decontaminate_threshold: float = opt(0.5, "Share of shared n-grams at which a training task "
                                         "counts as overlapping.", lambda v: 0 < v <= 1,
                                         "use a number in (0, 1]")


@dataclass(frozen=True)
class GenerationConfig:
    num_samples_per_prompt: int = opt(4, "G: completions sampled for each prompt (a group). "
                                      "At least 2 (a group of 1 has no baseline), except with "
                                      "rl.advantage gae.", _pos)
    max_new_tokens: int = opt(128, "Most tokens generated per completion.", _pos)
    temperature: float = opt(1.0, "Sampling temperature; training log-probs use the same one.",
                             _pos)
    top_p: float = opt(1.0, "Nucleus sampling (1.0: off). Truncation biases the PPO ratio: watch "
                       "kl/sample_train.", lambda v: 0 < v <= 1)
    top_k: int = opt(0, "Top-k sampling (0: off).", _nonneg)
    prefill_once: bool = opt(True, "Prefill each prompt once and share its KV cache with the G "
                             "completions of its group.")
    completion_batch_size: int = opt(0, "Most sequences decoded at once (0: as many of the P x G "
                                     "as the memory plan fits, MLX; all of them, torch).",
                                     _nonneg)
    score_while_decoding: bool = opt(True, "Score each group (sandbox, teacher) as soon as its "
                                     "last completion ends, while the rest still decode; the "
                                     "same rewards as scoring after. Single-turn only.")
    max_turns: int = opt(1, "Answers per conversation (1: single answers). Above 1, an answer "
                         "that fails its task's visible tests gets the exec reward's failure "
                         "report as the next user turn and answers again, up to max_turns or "
                         "until the visible tests pass; the last answer is scored on the hidden "
                         "tests. Needs reward.type exec or mix (MLX backend).", _pos)
    visible_tests: float = opt(0.5, "max_turns > 1: the share of a task's tests shown in the "
                               "feedback (the first ones; at least one, and one kept hidden when "
                               "there are two or more); the rest score the last answer. A task "
                               "with one test (or HumanEval-style checks) shows and scores it.",
                               lambda v: 0 < v < 1, "use a number strictly between 0 and 1")
    feedback_chars: int = opt(600, "max_turns > 1: the longest feedback turn, in characters.",
                              _pos)
    fuse_lora_max_mb: int = opt(256, "MLX: decode with the LoRA adapters fused into a temporary "
                                "copy of the adapted weights when that copy takes at most this "
                                "many MB (0: never; quantized weights: never). Small models decode "
                                "faster fused; the copy costs memory.", _nonneg)
    speculative: Literal["off", "ngram"] = opt(
        "off", "MLX: ngram drafts up to draft_tokens tokens per row and step from the sequence so "
        "far (prompt lookup: the continuation of the longest earlier n-gram match) and verifies "
        "them in one forward pass, keeping the sampled distribution exactly (a drafted token is "
        "kept when the sampler draws it). Pays where decoding is bound by reading the weights "
        "(Apple silicon, larger models) and completions copy their prompt: BENCHMARKS.md.")
    draft_tokens: int = opt(4, "speculative ngram: most tokens drafted per row and step (the "
                            "verification pass is 1 + draft_tokens positions wide).", _pos)


@dataclass(frozen=True)
class RLConfig:
    advantage: Literal["grpo", "rloo", "reinforce", "gae"] = opt(
        "grpo", "Baseline: grpo (group mean), rloo (leave-one-out), reinforce (running mean), or "
        "gae: PPO with a critic (a value head on the policy's last hidden state), per-token "
        "advantages by generalized advantage estimation, whitened; groups of 1 allowed. With "
        "generation.max_turns > 1, GAE, its whitening and the value loss run over the "
        "student's tokens only (a feedback token is no time step).")
    scale: Literal["group", "batch", "none"] = opt(
        "group", "Divide advantages by the group std, the batch std, or nothing (Dr. GRPO).")
    whiten: bool = opt(False, "Whiten advantages over the batch after the baseline.")
    drop_zero_std: bool = opt(True, "Leave zero-variance groups out of the loss (they carry no "
                              "signal); counted as reward/frac_zero_std either way.")
    reinforce_decay: float = opt(0.9, "EMA decay of the reinforce running baseline.", _unit)
    kl_penalty: float = opt(0.02, "KL penalty coefficient against the KL reference "
                            "(rl.reference: the frozen base with LoRA off, by default). "
                            "0 skips the reference forward entirely.", _nonneg)
    kl_estimator: Literal["k1", "k2", "k3"] = opt(
        "k2", "KL estimator of the loss's KL term (r = ref/policy on the sampled token; the "
        "gradient through the policy's log-prob, on-policy): k2 = (log r)^2 / 2, gradient that "
        "of KL(policy || ref) (the default); k3 = r - 1 - log r, an unbiased value of KL(policy "
        "|| ref) but the gradient of KL(ref || policy), the reverse direction; k1 = -log r has "
        "zero gradient in expectation, so k1 in the loss (kl_penalty > 0, kl_in_reward false) "
        "is refused. Not used with kl_in_reward (the reward takes k1).")
    kl_in_reward: bool = opt(False, "Subtract kl_penalty * sum_t k1 (over the student's tokens) "
                             "from each reward instead of adding KL to the loss; kl/mean is "
                             "then k1's mean over the student's tokens, what adaptive_kl "
                             "steers on.")
    adaptive_kl: bool = opt(False, "Adapt kl_penalty toward kl_target (Ziegler et al. controller); "
                            "on --resume the controller's value continues unless rl.kl_penalty "
                            "was changed.")
    kl_target: float = opt(0.05, "Target KL per token for the adaptive controller.", _pos)
    kl_horizon: int = opt(1000, "Horizon (in sequences) of the adaptive controller.", _pos)
    loss: Literal["ppo", "cispo"] = opt(
        "ppo", "Policy term: ppo (clipped surrogate) or cispo (REINFORCE weighted by the clipped "
        "ratio, detached: MiniMax-M1's CISPO; no token's gradient is zeroed).")
    ratio_level: Literal["token", "sequence"] = opt(
        "token", "Importance ratio per token, or per sequence: exp of the mean token log-ratio, "
        "clipped per sequence (GSPO, as published: with loss_agg auto each sequence counts "
        "once, and the clip range defaults to 3e-4 / 4e-4). policy/clipfrac is then the share "
        "of trained tokens whose sequence was clipped. The sampler's log-probs are the old "
        "policy: a sampler/trainer gap above about 4e-4 nats a token (kl/sample_train, half "
        "its mean square, about 8e-8) clips whole sequences.")
    clip_low: float | None = opt(None, "PPO clip: ratio lower bound is 1 - clip_low (null: 0.2 "
                                 "for token ratios, 3e-4 for sequence ratios).",
                                 lambda v: v is None or 0 <= v <= 1, "use a number in [0, 1] "
                                 "or null")
    clip_high: float | None = opt(None, "PPO clip: ratio upper bound is 1 + clip_high (null: "
                                  "0.28 for token ratios, DAPO's clip-higher; 4e-4 for sequence "
                                  "ratios).", lambda v: v is None or v >= 0,
                                  "use a number >= 0 or null")
    loss_agg: Literal["auto", "token", "sequence", "constant"] = opt(
        "auto", "Loss aggregation: token mean over the whole batch (DAPO), mean of per-sequence "
        "means (GRPO; GSPO's 1/G), or sum / (sequences x max_new_tokens) (Dr. GRPO); auto: "
        "sequence with ratio_level sequence, else token. token or constant with ratio_level "
        "sequence is refused (each sequence would count by its length, not GSPO).")
    entropy_coef: float = opt(0.0, "Entropy bonus coefficient.", _nonneg)
    num_iterations: int = opt(1, "Updates per rollout batch (PPO epochs); the sampler log-probs "
                              "are the old policy, so extra iterations cost no extra forward.", _pos)
    mask_truncated: bool = opt(False, "Leave completions cut at max_new_tokens out of the loss "
                               "(after overlong_penalty shaped the rewards: they still count in "
                               "their group's baseline).")
    overlong_penalty: float = opt(
        0.0, "DAPO's soft overlong penalty (0: off): a completion longer than max_new_tokens - "
        "overlong_buffer tokens loses reward linearly in the excess, this much at "
        "max_new_tokens. In reward units: rewards are 0..1 here, so DAPO's 1 on its -1..1 "
        "scale is 0.5. Shapes the reward the advantages use; dynamic sampling's and "
        "drop_zero_std's test for signal read the unshaped reward, and reward/mean reports it.",
        _nonneg)
    overlong_buffer: int = opt(0, "overlong_penalty: the last tokens before max_new_tokens over "
                               "which the penalty grows (DAPO's L_cache), 1..max_new_tokens.",
                               _nonneg)
    is_correction: Literal["none", "tis", "mis"] = opt(
        "none", "Correct the sampler/trainer mismatch (docs/mismatch.md): none uses the sampler's "
        "log-probs as the old policy; tis takes the PPO ratio against the trainer's own "
        "log-probs at the sampling weights (recomputed for free in the first iteration) times "
        "the truncated importance weight min(pi_old / pi_sampler, is_cap); mis the same weight "
        "with tokens (or sequences) whose weight leaves [1/is_cap, is_cap] masked out.")
    is_cap: float = opt(2.0, "is_correction: C, the weight's cap (tis) or bounds [1/C, C] (mis); "
                        "also the bound of policy/sampler_far_frac (|log-prob gap| > ln C).",
                        lambda v: v > 1, "use a number above 1")
    is_level: Literal["token", "sequence"] = opt(
        "token", "is_correction: one weight per token, or per sequence (the geometric mean of "
        "its token weights; pairs with ratio_level sequence).")
    turn_discount: float = opt(1.0, "max_turns > 1: the last answer's reward times "
                               "turn_discount ** (answers - 1).", _unit)
    early_pass_bonus: float = opt(0.0, "max_turns > 1: added to the reward of a conversation "
                                  "whose last answer passes, times the share of turns it did not "
                                  "need.", _nonneg)
    dynamic_sampling: bool = opt(False, "Train each step on batch_size groups whose rewards "
                                 "vary: sample oversample times the shortfall of prompts, keep "
                                 "the groups with signal, sample again while too few (at most "
                                 "max_extra_rounds more rounds), carry the rest to the next step "
                                 "(DAPO's dynamic sampling). Needs num_samples_per_prompt >= 2 "
                                 "(a group of one never varies).")
    oversample: float = opt(1.5, "dynamic_sampling: prompts drawn per group still needed.",
                            lambda v: v >= 1, "use 1 or more")
    max_extra_rounds: int = opt(2, "dynamic_sampling: sampling rounds after the first, at "
                                "most, when too few groups have signal.", _nonneg)
    carry_max_age: int | None = opt(None, "dynamic_sampling: a carried group is used only "
                                    "while at most this many optimizer updates old (its "
                                    "recorded log-probs make the clipped ratio); older ones are "
                                    "dropped. A step makes num_iterations updates, so a group "
                                    "carried one step is num_iterations updates old. null: "
                                    "num_iterations (a group is carried one step); 0: never "
                                    "carry; a value between them is refused (nothing would ever "
                                    "be carried).", lambda v: v is None or v >= 0,
                                    "use null, 0 or a positive number of updates")
    guidance: bool = opt(False, "Off-policy guidance (LUFFY): a group whose every completion "
                         "scores below the task's reference solution (its record's solution "
                         "field, scored by the same reward) gets that solution in place of its "
                         "last completion, so tasks the model never solves still teach (one "
                         "extra reward call per group).")
    gamma: float = opt(1.0, "gae: discount per token.", _unit)
    lam: float = opt(0.95, "gae: lambda of generalized advantage estimation (1: returns minus "
                     "values, 0: one-step TD errors).", _unit)
    value_coef: float = opt(0.5, "gae: weight of the value loss.", _nonneg)
    value_clip: float = opt(0.2, "gae: clip of the value loss around the old values (0: "
                            "unclipped).", _nonneg)
    reference: Literal["base", "ema", "periodic", "initial"] = opt(
        "base", "The KL reference: the frozen base (LoRA bypassed), or the base plus a copy of "
        "the adapters: a slowly moving one, an EMA of them (ema) or a copy refreshed every "
        "ref_update_every steps (periodic), or the frozen adapters the run started from "
        "(initial: lora.init_adapter, e.g. the SFT model; never updated). With a quantized base "
        "that is the quantized base plus the copy. Adapter-sized memory, no second model.")
    ref_ema_decay: float = opt(0.99, "reference ema: the copy's decay per step.", _unit)
    ref_update_every: int = opt(50, "reference periodic: steps between refreshes.", _pos)


@dataclass(frozen=True)
class TrainingConfig:
    batch_size: int = opt(2, "P: prompts per step; a step trains on P x G completions.", _pos)
    num_epochs: int = opt(0, "Passes over the training tasks, each ceil(tasks / prompts per "
                          "step) steps (with dynamic sampling or the curriculum that step count, "
                          "though a step may draw more tasks). 0: one epoch, or as many as "
                          "max_steps or max_minutes needs. Set beside max_steps, whichever ends "
                          "first (the start line says which).", _nonneg)
    max_steps: int = opt(0, "The number of steps: the task file cycles as often as needed "
                         "(unless num_epochs is set too: whichever ends first). 0: "
                         "num_epochs decides.", _nonneg)
    max_minutes: float = opt(0.0, "Stop after the step that passes this many minutes of training "
                             "in this process (0: no limit), then save and evaluate as at the "
                             "end: runs compared in the same wall-clock budget. Alone (max_steps "
                             "0, num_epochs 0) it is the only bound: the task file cycles until "
                             "then.", _nonneg)
    learning_rate: float = opt(1e-4, "Peak AdamW learning rate.", _pos)
    weight_decay: float = opt(0.0, "AdamW weight decay.", _nonneg)
    warmup_steps: int = opt(0, "Linear warmup steps.", _nonneg)
    lr_schedule: Literal["constant", "cosine"] = opt("constant", "After warmup: constant or "
                                                     "cosine decay to min_lr_ratio * lr.")
    min_lr_ratio: float = opt(0.1, "Final lr of the cosine schedule, relative to the peak.", _unit)
    gradient_accumulation_steps: int = opt(
        1, "Rollout batches per optimizer step: each step samples and scores this many batches "
        "of batch_size prompts one after the other (decoding at most batch_size x G sequences "
        "at a time), then takes one optimizer step on all of them, micro-batched (to batch_size "
        "x G sequences unless micro_batch_size is smaller): the update of a batch this many "
        "times larger in the memory of one.", _pos)
    micro_batch_size: int = opt(0, "Sequences per forward/backward; gradients accumulate over "
                                "micro-batches (0: MLX, the most the memory plan fits; torch, "
                                "the whole batch at once, or with gradient accumulation "
                                "batch_size x G).", _nonneg)
    grad_checkpoint: Literal["auto", "on", "off"] = opt(
        "auto", "Gradient checkpointing per transformer block in the update: on keeps only each "
        "block's input for the backward pass and runs the block's forward again there (far "
        "less activation memory for that compute); auto: on where the memory plan needs it "
        "(the torch backend has no plan: auto is off there).")
    max_memory_gb: float = opt(0.0, "MLX memory budget of the run in GB (2^30 bytes, as the "
                               "memory/ metrics); 0: what the device can use (on Apple silicon "
                               "85% of MLX's recommended working set, elsewhere 85% of the "
                               "available RAM). The memory plan fits the decode width, the "
                               "micro-batch size and checkpointing into it (where they are 0 / "
                               "auto) and stops a run that cannot fit before it starts.", _nonneg)
    share_prompt: bool = opt(True, "Forward each prompt once for all its completions (same "
                             "result, fewer positions); off: every sequence in full. Models "
                             "without plain KV caches always take the full forward (MLX only).")
    max_grad_norm: float = opt(1.0, "Clip the global gradient norm (0: off).", _nonneg)
    seed: int = opt(0, "Seed of data order, sampling and LoRA init.")
    output_dir: str = opt("runs/latest", "Run directory: config, metrics, checkpoints.")
    save_every_batches: int = opt(0, "Checkpoint every N steps (0: off).", _nonneg)
    save_every_epochs: int = opt(1, "Checkpoint at the end of every N epochs (0: off).", _nonneg)
    save_total_limit: int = opt(3, "Keep only the newest N checkpoints (0: keep all).", _nonneg)
    keep_best: bool = opt(False, "Keep the checkpoint with the best periodic held-out pass@1 "
                          "(ties: mean reward) beside the newest ones, never pruned; named in "
                          "checkpoints/best.json (needs data.eval_file and data.eval_every).")
    prevent_sleep: bool = opt(True, "macOS: keep the Mac from idle sleep while the run lives "
                              "(caffeinate -i -w <pid>). A closed lid on battery still sleeps "
                              "(docs/training.md, On a laptop).")
    on_battery: Literal["continue", "pause", "stop"] = opt(
        "continue", "macOS: when the power is lost (pmset -g batt): continue (a line says so), "
        "pause after the step with a checkpoint written until AC power returns (the pause is "
        "not training time), or stop as max_minutes does.")
    save_mlx_model_bits: int = opt(0, "Also write each checkpoint's fused model to mlx_model/: "
                                   "0 off, 16 unquantized, 4 or 8 quantized.",
                                   lambda v: v in (0, 4, 8, 16), "use 0, 4, 8 or 16")


@dataclass(frozen=True)
class ExecConfig:
    sandbox: Literal["auto", "bwrap", "seatbelt", "process"] = opt(
        "auto", "Isolation: auto picks bwrap on Linux, seatbelt on macOS, and logs which at start; "
        "where neither works it stops (as root: process limits, a uid per slot). process runs "
        "student code with your own rights: choose it only on purpose. `mlx-rlaif doctor` "
        "tests the one in use.")
    timeout_s: float = opt(5.0, "Wall-clock limit per sandboxed run (every process of the run is "
                           "killed). One run answers all calls of a function task; a stdin/stdout "
                           "task runs once per test.", _pos)
    cpu_s: int = opt(5, "CPU-time limit per run.", _pos)
    memory_mb: int = opt(512, "Address-space limit per process of a run, and the limit of the "
                         "resident memory of all its processes together (a watchdog, every "
                         "platform).", _pos)
    max_output_kb: int = opt(64, "Output kept per run; the rest is dropped.", _pos)
    max_file_size_mb: int = opt(16, "Largest file a run may write (stdout and stderr included).",
                                _pos)
    max_open_files: int = opt(64, "Open-file limit per process of a run.", _pos)
    max_processes: int = opt(16, "Processes and threads a run may have at once.", _pos)
    build_timeout_s: float = opt(60.0, "Wall-clock limit for compiling one C++ or Rust solution.",
                                 _pos)
    build_memory_mb: int = opt(4096, "Address-space limit per compiler process (and the "
                               "resident limit of a whole build).", _pos)
    workers: int = opt(0, "Completions scored in parallel (0: every core; in train, while a "
                       "group is scored as the next one decodes, the cores decoding leaves "
                       "free).", _nonneg)
    cache_size: int = opt(4096, "Answers whose results are kept across steps: a completion "
                          "whose task and extracted code (trailing whitespace aside) were "
                          "scored before gets that result without running (reward/exec_served_frac). "
                          "Never kept: timeouts, memory kills, sandbox errors. 0: off; set 0 "
                          "where a reward reads the exec result's timing (details.seconds).",
                          _nonneg)
    build_weight: float = opt(0.1, "Weight of the builds/parses part of the exec reward.", _unit)
    tests_weight: float = opt(0.9, "Weight of the tests part.", _unit)
    tests_credit: Literal["fraction", "all"] = opt(
        "fraction", "The tests part: the fraction of tests passed (partial credit), or all: 1 only "
        "when every test passes (no credit for a near miss).")
    python: str = opt("", "Python interpreter for student code (empty: the one running "
                      "mlx-rlaif, or a system python3 the sandbox user can run).")
    cpp_compiler: str = opt("", "C++ compiler (empty: g++, else clang++, on PATH).")
    cpp_flags: tuple[str, ...] = opt(("-std=c++17", "-O1", "-pipe"), "C++ compiler flags.")
    cpp_pch: bool = opt(True, "Precompile <bits/stdc++.h> and <iostream> once per compiler and "
                        "flags (GCC on Linux; cached in ~/.cache/mlx-rlaif/pch, about 125 MB) so "
                        "that C++ builds that start with them take a fraction of the time; GCC "
                        "uses them only where equivalent, so verdicts do not change.")
    rust_flags: tuple[str, ...] = opt(("--edition", "2021", "-C", "opt-level=1"),
                                      "rustc flags.")
    uid_base: int = opt(64000, "When mlx-rlaif runs as root: student code runs as uids uid_base, "
                        "uid_base + 1, ... (one per parallel slot; no account may use them).",
                        _pos)
    hack_penalty: float = opt(
        0.0, "Subtracted from the exec reward (floored at 0) of a completion that raises a "
        "reward-hacking signal (docs/hacking.md); at build_weight + tests_weight or more it "
        "zeroes it. 0: off, the signals are only logged. Off by default: penalizing a detector "
        "teaches the policy to evade the detector, and a hack it cannot name is still contained "
        "by the sandbox.", _nonneg)
    hack_penalty_signals: tuple[str, ...] = opt(
        (), "The signals hack_penalty applies to (e.g. [eq_override, exit_call]); empty: all.")


@dataclass(frozen=True)
class TeacherConfig:
    provider: Literal["none", "anthropic", "openai"] = opt(
        "none", "Teacher API: anthropic (Messages) or openai (Chat Completions; any "
        "OpenAI-compatible server with base_url).")
    model: str = opt("", "Teacher model name (e.g. claude-3-5-haiku-latest, gpt-4o-mini).")
    base_url: str = opt("", "API base URL (OpenAI-compatible servers, proxies).")
    api_key_env: str = opt("", "Environment variable holding the key (default: ANTHROPIC_API_KEY "
                           "or OPENAI_API_KEY). The key is never written anywhere.")
    mode: Literal["absolute", "ratio", "rank"] = opt(
        "absolute", "absolute: the student's rubric score; ratio: student/teacher score clipped to "
        "[0, 1] (the teacher's reference solution judged on the same rubric); rank: the teacher "
        "sees the whole group at once and grades the candidates against each other (one call "
        "per group).")
    criteria: dict = opt({"correctness": 0.3, "code_quality": 0.3, "efficiency": 0.2,
                          "documentation": 0.2}, "Rubric criteria and their weights, each scored "
                         "0..1 by the judge: {name: weight} or {name: {weight: w, description: "
                         "text}}; names are letters, digits and _.")
    concurrency: int = opt(4, "Teacher calls in flight at once.", _pos)
    max_retries: int = opt(3, "SDK retries (429, 5xx, timeouts; retry-after honoured).", _nonneg)
    timeout_s: float = opt(60.0, "SDK timeout per request.", _pos)
    max_tokens: int = opt(512, "Most tokens the judge may answer with.", _pos)
    temperature: float | None = opt(0.0, "Sampling temperature of an openai teacher (null: the "
                                    "server's default, for models that accept no other). The "
                                    "anthropic SDK takes none: the model's default applies.",
                                    lambda v: v is None or 0 <= v <= 2, "use 0..2 or null")
    structured_output: bool = opt(True, "Ask for structured answers (Anthropic tool use, OpenAI "
                                  "json_schema); turn off for servers that reject "
                                  "response_format. The parser is strict either way.")
    reference: bool = opt(True, "The teacher writes a reference solution per task (cached) and "
                          "judges it (details teacher_code, teacher_score); absolute and rank "
                          "modes show it to the judge. Always on in ratio mode.")
    cache_path: str = opt("", "sqlite cache of judgements (default: <output_dir>/teacher_cache.db).")
    max_cost_usd: float = opt(0.0, "End the run cleanly when the estimated cost reaches this "
                              "(0: no limit).", _nonneg)
    price_in_per_mtok: float = opt(0.0, "USD per million input tokens, for cost estimates.",
                                   _nonneg)
    price_out_per_mtok: float = opt(0.0, "USD per million output tokens.", _nonneg)
    samples: int = opt(1, "Judgements per completion, averaged per criterion (each a call and a "
                       "cache entry of its own): less judge noise for S times the calls. They "
                       "differ only at a temperature above 0.", _pos)
    strip_comments: bool = opt(False, "Judge the correctness criterion in a call of its own on "
                               "the code with comments and docstrings removed (a comment cannot "
                               "talk the judge into it); the other criteria see the code as "
                               "written. One more call per judgement.")
    rank_debias: bool = opt(True, "Rank mode: show each call's group in its own seeded order and "
                            "subtract the judge's mean score at each position (its running "
                            "statistics, once every position has 20 judgements).")


@dataclass(frozen=True)
class RewardComponent:
    kind: Literal["exec", "teacher", "syntax", "function", "server"] = opt(
        "function", "exec, teacher and syntax: the built-in rewards (their settings: reward.exec, "
        "reward.teacher); function: a Python function of yours (fn); server: an HTTP reward "
        "server (url). docs/rewards.md: the contract.")
    fn: str = opt("", "kind function: path/to/file.py:function or package.module:function.")
    url: str = opt("", "kind server: the URL the batch is POSTed to (http://host:port/).")
    protocol: Literal["mlx-rlaif", "openrlhf"] = opt(
        "mlx-rlaif", "kind server: the JSON of the request and the answer: ours ({items} -> "
        "{rewards}) or OpenRLHF's ({query, prompts, labels} -> {rewards}).")
    name: str = opt("", "Its metric key, reward/<name>/... (default: the kind, or the "
                    "function's name).")
    weight: float = opt(1.0, "Its weight in the sum (0: computed and logged, not trained on).",
                        _nonneg)
    kwargs: dict = opt({}, "Keyword arguments passed to the function as they are (kind "
                       "server: sent in each request; serve-reward accepts only the keys its "
                       "operator allows with --request-kwarg).")
    timeout_s: float = opt(30.0, "kind function: the most seconds one call may take (a "
                           "completion's, or a batch's or group's for a function of lists): "
                           "past it the worker process is killed; kind server: the whole "
                           "request's deadline (connect, send, every byte of the answer).",
                           _pos)
    group: bool = opt(False, "kind function taking lists (completions, prompts, ...): called once "
                      "per prompt with its G completions, instead of once with the whole batch.")


@dataclass(frozen=True)
class RewardConfig:
    type: Literal["exec", "syntax", "teacher", "mix"] = opt(
        "exec", "exec: run tests in a sandbox; syntax: Python parses; teacher: rubric judge; "
        "mix: weighted mean of the exec and teacher values that are not None.")
    exec_weight: float = opt(0.5, "With type mix: weight of the exec reward.", _unit)
    teacher_weight: float = opt(0.5, "With type mix: weight of the teacher reward.", _unit)
    agreement_window: int = opt(10, "With type mix: steps over which the judge is compared with "
                                "the exec reward (teacher/exec_corr, teacher/best_disagree, "
                                "teacher/fail_over_pass).", _pos)
    components: tuple[RewardComponent, ...] = opt(
        (), "The reward as a list of components, each {kind, fn|url, name, weight, kwargs, "
        "timeout_s, group} (empty: reward.type's equivalent). docs/rewards.md.")
    functions: tuple[str, ...] = opt(
        (), "Your functions added to the reward, each FILE.py:fn[@weight] or pkg.mod:fn[@weight] "
        "(weight 1 unless given): what --reward FILE.py:fn@0.3 sets.")
    aggregation: Literal["sum", "normalize"] = opt(
        "sum", "With components or functions: the weighted sum of the components that are not "
        "None, or normalize: each component first standardized within its group (z-score over "
        "the prompt's completions), then summed.")
    on_error: Literal["stop", "unscorable"] = opt(
        "stop", "A function or server that raises, times out or returns something else than a "
        "number, None or a dict of numbers: stop the step (before the update and any "
        "checkpoint), or count it and leave that completion unscorable for that component.")
    max_error_frac: float = opt(0.1, "on_error unscorable: stop once more than this fraction of "
                                "a batch's completions errs for one component.", _unit)
    workers: int = opt(2, "Worker processes per function component (killed and restarted when "
                       "one hangs past its timeout).", _pos)
    concurrency: int = opt(8, "async def functions: calls in flight at once per worker.", _pos)
    exec: ExecConfig = field(default_factory=ExecConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)


def reward_components(r: RewardConfig) -> list[RewardComponent]:
    """The reward as its list of components: reward.components (or reward.type's equivalent:
    exec, syntax, teacher, or mix as exec and teacher at exec_weight and teacher_weight), then
    reward.functions, each with its name filled in (the kind, the function's name)."""
    if r.components:
        out = list(r.components)
    elif r.type == "mix":
        out = [RewardComponent(kind="exec", weight=r.exec_weight),
               RewardComponent(kind="teacher", weight=r.teacher_weight)]
    else:
        out = [RewardComponent(kind=r.type)]
    out += [function_component(spec) for spec in r.functions]
    return [c if c.name else replace(c, name=default_name(c)) for c in out]


def with_functions(cfg: Config, specs: list[str] | tuple[str, ...] | None) -> Config:
    """The config with `specs` (`--reward FILE.py:fn@w`, repeatable) added to
    reward.functions."""
    if not specs:
        return cfg
    r = cfg.reward
    return replace(cfg, reward=replace(r, functions=(*r.functions, *specs)))


def function_component(spec: str) -> RewardComponent:
    """`FILE.py:fn@0.3` (or `pkg.mod:fn`, weight 1 without `@`) as a function component; the
    weight is checked with the rest (config/loading.py check)."""
    target, at, weight = spec.rpartition("@")
    if not at or "/" in weight or ":" in weight:
        return RewardComponent(kind="function", fn=spec)
    try:
        w = float(weight)
    except ValueError:
        w = float("nan")
    return RewardComponent(kind="function", fn=target, weight=w)


def default_name(c: RewardComponent) -> str:
    if c.kind == "function":
        return c.fn.rpartition(":")[2] or "function"
    return c.kind


@dataclass(frozen=True)
class LoggingConfig:
    tensorboard: bool = opt(True, "Write TensorBoard event files to <output_dir>/tensorboard.")
    dashboard: bool = opt(True, "Live rich dashboard when stdout is a terminal.")
    log_every: int = opt(1, "Print/log metrics every N steps.", _pos)
    samples_per_step: int = opt(8, "Completions written to samples.jsonl per step (0: none).",
                                _nonneg)
    health_check_enabled: bool = opt(True, "Print a health-check line every N steps.")
    health_check_interval_batches: int = opt(5, "N for the health check.", _pos)
    baseline_eval_batches: int = opt(0, "Score the first N batches before training as the "
                                     "baseline reward (0: use the first step's reward).", _nonneg)
    collect_dataset: bool = opt(True, "Write train/validation/evaluation dataset JSONL.")
    wandb: bool = opt(False, "Also log to Weights & Biases (pip install 'mlx-rlaif[wandb]'): "
                      "TensorBoard's metric keys, the config, the samples table; rank 0 only. "
                      "WANDB_MODE=offline keeps the run in <output_dir>/wandb.")
    trackio: bool = opt(False, "Also log to trackio, Hugging Face's local-first tracker (pip "
                        "install 'mlx-rlaif[trackio]'): the same as logging.wandb, in its local "
                        "store (TRACKIO_DIR).")
    tracker_project: str = opt("mlx-rlaif", "The W&B / trackio project name.")
    tracker_run_name: str = opt("", "The W&B / trackio run name (empty: the output directory's "
                                "name).")


@dataclass(frozen=True)
class DistributedConfig:
    timeout_s: float = opt(1800.0, "Several machines (mlx.launch, torchrun): a rank whose "
                           "collective (a gradient all-reduce, an exchange of metrics) has waited "
                           "this long for the others ends with an error, instead of hanging when a "
                           "rank hung or a machine dropped off the network (a rank that exits is "
                           "noticed at once). Above the longest wait between ranks in a step.",
                           _pos)


SELF_CONTEXT = ("feedback", "critique", "sibling")


@dataclass(frozen=True)
class DistillConfig:
    kind: Literal["off", "teacher", "self"] = opt(
        "off", "A target for every token (docs/algorithms.md, distillation): teacher (a local "
        "model, distill.teacher, scores each of the student's tokens: on-policy distillation), "
        "self (the student itself, shown the feedback the run already has, scores its own "
        "attempt: self-distillation) or off. MLX only.")
    teacher: str = opt("", "kind teacher: the teacher model, a directory or hub id mlx-lm loads "
                       "(loaded once, frozen, no adapters). Its tokenizer must encode text to "
                       "the student's ids (checked at load).")
    teacher_quantize: int = opt(0, "kind teacher: quantize the teacher's weights to this many "
                                "bits at load (4 or 8; 0: as stored).",
                                lambda v: v in (0, 4, 8), "use 0, 4 or 8")
    self_adapters: Literal["policy", "reference"] = opt(
        "policy", "kind self: who scores the attempt with the feedback in its context: the "
        "current policy (adapters on), or the KL reference (reference: the frozen base by "
        "default).")
    self_context: tuple[str, ...] = opt(
        SELF_CONTEXT, "kind self: what goes into the scorer's context: feedback (the exec "
        "report of the completion's failed tests, built by trusted code), critique (a teacher "
        "judge's rationale), sibling (a completion of the same group that passed every test). "
        "A completion with none of them, or one that passed without a sibling, gets no term.",
        lambda v: bool(v) and set(v) <= set(SELF_CONTEXT),
        "list some of feedback, critique, sibling")
    coef: float = opt(1.0, "The per-token advantage coef * (log p_target - log p_student), "
                      "log p_student the sampler's.", _pos)
    clip: float = opt(0.0, "Clip each token's distillation advantage to [-clip, clip] (0: no "
                      "clip).", _nonneg)
    weight_reward: float = opt(1.0, "Weight of the sequence advantage from the rewards added to "
                               "the per-token term (0: pure distillation, every completion kept "
                               "whatever its group's rewards).", _nonneg)


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)


def prompts_per_step(cfg: Config) -> int:
    """Prompts one optimizer step trains on: batch_size x gradient_accumulation_steps."""
    return cfg.training.batch_size * cfg.training.gradient_accumulation_steps


def batch_sequences(cfg: Config) -> int:
    """Sequences one optimizer step trains on (before any is left out): prompts x G."""
    return prompts_per_step(cfg) * cfg.generation.num_samples_per_prompt


def micro_batch_size(cfg: Config) -> int:
    """Sequences per forward/backward: training.micro_batch_size, else batch_size x G when
    accumulating over rollout batches (0: all at once)."""
    t = cfg.training
    if t.micro_batch_size or t.gradient_accumulation_steps == 1:
        return t.micro_batch_size
    return t.batch_size * cfg.generation.num_samples_per_prompt
