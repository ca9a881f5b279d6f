"""The memory model of an MLX run, the plan made from it before the first step, and the device's
limits.

A step's MLX memory is the base's weights and the adapters' state (always there) plus the
largest of three phases: decoding (the KV cache of the rows decoding together, mlx-lm's caches
growing in steps of 256 positions, the sampler's vocabulary-sized buffers, the fused adapter
copy), the reference pass (a forward without gradients) and the update (the activations the
backward pass keeps for a micro-batch, all of them or, with per-block checkpointing, each
block's input plus one block's worth; the attention's scores; the loss's hidden states and its
chunks of logits beside them, the update being one pass: loss.py). Each is a pure function of the model's shapes (`Shape`) and the
step's (`Work`), in bytes; the constants that are not shapes (how many chunk-sized buffers the
loss holds, how many score-sized ones the attention does) were measured on MLX's CPU backend
(BENCHMARKS.md, "Scale": the model against measured peaks at the Qwen2.5-0.5B shape).

`plan(...)` picks, where the config leaves them to it (0 / auto), the decode width, the
micro-batch size and per-block checkpointing: the widest decoding and the largest micro-batch
that fit the budget, a micro-batch's kept activations held under `activation_aim` (a share of
the budget, at least 1 GB), and
per-block checkpointing where one sequence's would be over it or no micro-batch fits without
it: the update's memory stays about the same whatever the completions' length (BENCHMARKS.md,
"Scale"). A run that cannot fit raises ConfigError naming the setting to change.

Sizes that follow the budget: the head's logits chunk (`logits_chunk_mb`), the compile limit
of the update (`compile_max_logits_mb`), the activation aim (`activation_aim`). During the
update and the reference pass MLX's memory limit is what is held plus the phase's predicted
bytes (`limited`, `phase_limit`), which bounds how far MLX's evaluation allocates ahead.
16-bit weights and activations are modelled by their item size (`Shape.act_bytes`), mlx-lm's
SwiGLU where the CPU kernels are off (`Shape.cpu_kernels`); the constants were measured on the
CPU build in float32 (tools/profile_update.py checks them on any device).

The budget (`device_budget`): `training.max_memory_gb`, else what the device can use: on Apple
silicon MLX's recommended working set, elsewhere the available RAM, with `HEADROOM`. On Apple
silicon (one device query, `recommended_working_set`) the wired limit is set (the run's
budget, or model.wired_limit_gb: train/memory_plan.py's `device_limits`, which also sets the
buffer cache's limit) and MLX's buffer cache is cleared between steps once it holds more than
`CACHE_CLEAR_SHARE` of the budget, as mlx-lm's trainer does (mlx-lm #828: memory creeping over
a long run).

Other architectures (`shape_of`, model_shape.py): a nested `text_config` (Qwen3.5, Mistral 3) is
read like flat arguments; where a model's blocks differ (hybrid SSM / linear-attention /
convolution layers, mixture-of-experts layers) each block's kept activations come from its own
layers and the caches' sizes from mlx-lm's own cache (KV for the attention layers, a fixed
state per row for the others); where the head does not split off (loss.split_head) the loss's
logits are counted whole.

Not covered: models whose text model's `args` do not name the hidden size, heads and
vocabulary (no plan is made: `shape_of` returns None), rotating or quantized KV caches (counted
as full ones), memory outside MLX (Python, the tokenizer, the sandboxes: the headroom is for
them).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ... import cpu
from ...errors import ConfigError
from .loss import LOGITS_CHUNK_MB, chunk_tokens, split_head
from .model_shape import cache_sizes, layer_elems, once, text_args
from .speculative import COMPACT_AT

GiB = 2**30
HEADROOM = 0.85  # the share of the device's memory the default budget takes
CACHE_STEP = 256  # mlx-lm's KVCache grows by this many positions
ACTIVATION_TARGET = GiB  # kept activations of one micro-batch, at least this aim (small budgets)
ACTIVATION_SHARE = 1 / 16  # ... and this share of the budget where that is more
LOGITS_CHUNK_SHARE = 1 / 256  # one chunk's float32 logits: this share of the budget (or 64 MB)
COMPILE_SHARE = 1 / 16  # a micro-batch's float32 logits up to this share: the update compiled
COMPILE_MAX_LOGITS_MB = 64  # ... or up to this, whichever is more (the size without a budget)
CACHE_CLEAR_SHARE = 0.1  # Metal: clear MLX's buffer cache past this share of the budget
HEAD_CHUNKS_UPDATE = 4  # chunk-sized buffers the head holds beside the activations (measured)
HEAD_CHUNKS_RECOMPUTED = 6  # ... where the entropies are differentiated (logits recomputed)
HEAD_CHUNKS_REFERENCE = 5  # ... in the reference pass (measured)
SCORE_COPIES = 3  # score-sized arrays the attention of one block holds at once (measured)
STEP_BUFFERS = 4  # vocabulary-sized float32 arrays per row of a decoding step (logits, sampler)
RECOMPUTED = 5  # block-sized activations a checkpointed backward holds at once (measured)
UNFUSED_SWIGLU = 2  # [positions, intermediate] arrays SwiGLU keeps more without the CPU kernel


@dataclass(frozen=True)
class Shape:
    """What the memory depends on in a model. Bytes of an activation element: 4 (float32) or 2
    (bfloat16, float16: what Metal runs quantized models in)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    weight_bytes: int  # the base's weights as loaded (quantized included)
    act_bytes: int
    lora_params: int  # adapter parameters (float32)
    fused_bytes: int = 0  # the copies decoding makes (fused adapters; transposed on the CPU)
    cpu_kernels: bool = True  # cpu/kernels.py's fused SwiGLU (off: mlx-lm's, Metal and CUDA)
    # read from the model where it is not a uniform dense transformer (model_shape.py):
    kv_elems: int = 0  # key and value elements per position, all layers (0: from the heads)
    state_bytes: int = 0  # recurrent state per row (SSM, convolution, linear-attention caches)
    layer_elems: tuple[int, ...] = ()  # activations each block keeps per position (()): dense)
    full_logits: bool = False  # the head does not split off (loss.split_head): whole logits


@dataclass(frozen=True)
class Work:
    """One step's sizes: P prompts (per rollout batch) x G completions of at most `new_tokens`
    after prompts of at most `prompt_len` tokens; `train_rows` sequences per update."""

    prompts: int
    group: int
    prompt_len: int
    new_tokens: int
    train_rows: int
    chunk_mb: float = LOGITS_CHUNK_MB  # float32 logits of one head chunk (logits_chunk_mb)
    entropy_grad: bool = False  # the update differentiates the entropies (rl.entropy_coef > 0)
    shared: bool = True  # each prompt computed once (shared_prompt.py); False: rows in full
    draft_tokens: int = 0  # speculative rollouts: positions drafted per row and step (0: off)

    @property
    def rows(self) -> int:
        return self.prompts * self.group

    @property
    def width(self) -> int:
        """Positions of a row in the update, padded to 8: a completion row (its prompt's last
        token and the completion) where prompts are shared, else the whole sequence (models
        whose caches are not all plain KV caches: hybrid, sliding-window; share_prompt off)."""
        n = self.new_tokens + 1 if self.shared else self.prompt_len + self.new_tokens
        return -(-n // 8) * 8

    @property
    def context(self) -> int:
        """Positions each row attends to before its own: its shared prompt's (0: rows in full)."""
        return self.prompt_len if self.shared else 0


# --- sizes that scale with the budget --------------------------------------------------------------


def logits_chunk_mb(budget: int) -> float:
    """MB of float32 logits in one chunk of the loss's head (loss.head_logprobs): a share of the
    budget, at least LOGITS_CHUNK_MB (the size on small budgets, and where none is known)."""
    return max(float(LOGITS_CHUNK_MB), budget * LOGITS_CHUNK_SHARE / 2**20)


def compile_max_logits_mb(budget: int) -> float:
    """The largest micro-batch logits (MB, float32) whose update runs compiled: a share of the
    budget, at least COMPILE_MAX_LOGITS_MB."""
    return max(float(COMPILE_MAX_LOGITS_MB), budget * COMPILE_SHARE / 2**20)


def activation_aim(budget: int) -> int:
    """Kept activations of one micro-batch, at most, where the plan picks its size: a share of
    the budget, at least ACTIVATION_TARGET (1 GB on a 16 GB Mac and on this CPU build; a 100 GB
    GPU budget takes 16 sequences of 256 tokens of the 0.5B shape at once)."""
    return max(ACTIVATION_TARGET, int(budget * ACTIVATION_SHARE))


# --- the model -----------------------------------------------------------------------------------


def kv_elems(s: Shape) -> int:
    """Key and value elements one position keeps over all layers."""
    return s.kv_elems or 2 * s.layers * s.kv_heads * s.head_dim


def kv_cache_bytes(s: Shape, rows: int, length: int) -> int:
    """Keys and values of `rows` sequences of `length` positions, as mlx-lm allocates them, and
    the rows' recurrent state where the model has some."""
    allocated = math.ceil(length / CACHE_STEP) * CACHE_STEP
    return kv_elems(s) * s.act_bytes * rows * allocated + s.state_bytes * rows


def decode_bytes(s: Shape, w: Work, width: int) -> int:
    """Peak of decoding `width` rows: their caches (one layer's twice while it grows), the
    prompts' prefilled caches, the step's vocabulary-sized buffers, the fused adapter copy.
    Drafting (speculative.py) makes a step 1 + draft_tokens positions wide, and a row's cache
    longer by the padding rows accumulate before it is cut (`COMPACT_AT`) and one step's."""
    positions = 1 + w.draft_tokens
    slack = COMPACT_AT + positions if w.draft_tokens else 0
    cache = kv_cache_bytes(s, width, w.prompt_len + w.new_tokens + slack)
    growing = cache // s.layers
    prefill = kv_cache_bytes(s, w.prompts, w.prompt_len)
    return (cache + growing + prefill + STEP_BUFFERS * 4 * width * positions * s.vocab
            + s.fused_bytes)


def block_bytes(s: Shape) -> int:
    """Activations one block keeps per position for its backward pass: its input, the two
    norms' outputs, q, k, v, the attention's output, the residual, gate, up and their product
    (the attention's probabilities and, with the CPU kernels, SwiGLU's sigmoid are recomputed;
    mlx-lm's SwiGLU keeps its sigmoid and SiLU: UNFUSED_SWIGLU)."""
    if s.layer_elems:  # read from the model's own layers: the largest block
        return max(s.layer_elems) * s.act_bytes
    kv = s.kv_heads * s.head_dim
    swiglu = 3 + (0 if s.cpu_kernels else UNFUSED_SWIGLU)
    return (7 * s.hidden + 2 * kv + swiglu * s.intermediate) * s.act_bytes


def blocks_bytes(s: Shape) -> int:
    """Activations all blocks keep per position (each block's own where they differ)."""
    return sum(s.layer_elems) * s.act_bytes if s.layer_elems else s.layers * block_bytes(s)


def scores_bytes(s: Shape, rows: int, queries: int, keys: int) -> int:
    """The attention of one block: float32 scores of every query against every key."""
    return SCORE_COPIES * 4 * rows * s.heads * queries * keys


def head_bytes(s: Shape, w: Work, positions: int, chunks: int) -> int:
    """The loss's vocabulary-sized buffers: `chunks` arrays of one chunk's float32 logits (or
    of the whole micro-batch's, where it is smaller than a chunk), and in a 16-bit model the
    head's own output beside each; where the head does not split off (`full_logits`) the
    whole micro-batch's logits are one chunk."""
    per_position = (4 + (s.act_bytes if s.act_bytes < 4 else 0)) * s.vocab
    chunk = positions if s.full_logits else min(positions, chunk_tokens(s.vocab, w.chunk_mb))
    return chunks * per_position * chunk


def update_bytes(s: Shape, w: Work, rows: int, checkpoint: bool) -> int:
    """Peak of one micro-batch's forward and backward pass, one pass of the transformer
    (loss.rl_loss): the hidden states and their gradient, the prompts' keys and values gathered
    to the rows, the kept activations (every block's, or each block's input plus the recomputed
    block's with checkpointing) with one block's attention scores, and beside them the head's
    chunks in flight (MLX's evaluation runs ahead of the computation: `limited`), more where
    the backward pass recomputes them (`Work.entropy_grad`: loss.head_logprobs)."""
    positions = rows * w.width
    own = min(w.prompts, -(-rows // w.group)) * w.context + positions
    prefix = kv_elems(s) * s.act_bytes * rows * w.context
    hidden = 2 * positions * s.hidden * s.act_bytes
    body = (activation_bytes(s, w, rows, checkpoint)
            + scores_bytes(s, rows, w.width, w.width + w.context))
    chunks = HEAD_CHUNKS_RECOMPUTED if w.entropy_grad else HEAD_CHUNKS_UPDATE
    return hidden + prefix + body + head_bytes(s, w, own, chunks)


def activation_bytes(s: Shape, w: Work, rows: int, checkpoint: bool) -> int:
    """What the backward pass keeps for a micro-batch of `rows` completions: every block's
    activations, or with checkpointing each block's input and, while a block's backward pass
    runs, its recomputed activations and their gradients (RECOMPUTED blocks' worth)."""
    positions = rows * w.width
    if checkpoint:
        return positions * (s.layers * s.hidden * s.act_bytes + RECOMPUTED * block_bytes(s))
    return positions * blocks_bytes(s)


def reference_bytes(s: Shape, w: Work, rows: int) -> int:
    """Peak of the reference pass over a micro-batch: one block's activations and scores at a
    time, the hidden states, the loss's chunks."""
    positions = rows * w.width
    return (positions * (block_bytes(s) + s.hidden * s.act_bytes)
            + scores_bytes(s, rows, w.width, w.width + w.context)
            + head_bytes(s, w, positions, HEAD_CHUNKS_REFERENCE))


def fixed_bytes(s: Shape) -> int:
    """Always held: the weights, and the adapters with their gradient, the gradient summed
    over micro-batches and AdamW's two moments (float32)."""
    return s.weight_bytes + 5 * 4 * s.lora_params


def peak_bytes(s: Shape, w: Work, width: int, rows: int, checkpoint: bool,
               teacher: Shape | None = None) -> int:
    """A step's peak; with a `teacher` (distill.kind teacher) its weights always held and its
    forward over a micro-batch (the reference pass's, at its shapes) one phase more."""
    return fixed_bytes(s) + teacher_weights(teacher) + max(
        decode_bytes(s, w, width), reference_bytes(s, w, rows),
        update_bytes(s, w, rows, checkpoint), teacher_pass_bytes(teacher, w, rows))


def teacher_weights(t: Shape | None) -> int:
    return 0 if t is None else t.weight_bytes


def teacher_pass_bytes(t: Shape | None, w: Work, rows: int) -> int:
    """The teacher's forward over a micro-batch of `rows` (0 without a teacher)."""
    return 0 if t is None else reference_bytes(t, w, rows)


# --- the plan -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    budget: int
    decode_width: int
    micro_batch: int
    checkpoint: bool
    peak: int  # predicted MLX peak of a step
    weights: int
    decode: int
    update: int
    teacher: int = 0  # a distillation teacher's weights (distill.kind teacher)
    teacher_pass: int = 0  # ... and its forward over a micro-batch


def plan(s: Shape, w: Work, budget: int, decode_width: int = 0, micro_batch: int = 0,
         checkpoint: str = "auto", teacher: Shape | None = None) -> Plan:
    """The decode width, micro-batch size and checkpointing a run takes within `budget` bytes;
    a value the config sets (not 0 / auto) is kept and checked. ConfigError where nothing fits,
    naming the setting to change. A distillation `teacher`'s weights are held beside the
    student's, and its forward over a micro-batch must fit as the update's does."""
    base = fixed_bytes(s) + teacher_weights(teacher)
    w = replace(w, chunk_mb=logits_chunk_mb(budget))
    if base >= budget:
        raise ConfigError(f"the model's weights and adapters take {gb(base)} GB, over the "
                          f"memory budget of {gb(budget)} GB: quantize the base "
                          "(model.quantize: 4" + (", distill.teacher_quantize: 4" if teacher
                                                  else "") + ") or raise training.max_memory_gb")
    width = pick_width(s, w, budget - base, decode_width)
    options = {"auto": (False, True), "on": (True,), "off": (False,)}[checkpoint]
    for ck in options:
        bounded = checkpoint == "auto" and not ck  # a row over the aim: checkpointing instead
        rows = pick_rows(s, w, budget - base, micro_batch, ck, bounded, activation_aim(budget),
                         teacher)
        if rows:
            return Plan(budget, width, rows, ck, peak_bytes(s, w, width, rows, ck, teacher),
                        s.weight_bytes, decode_bytes(s, w, width), update_bytes(s, w, rows, ck),
                        teacher_weights(teacher), teacher_pass_bytes(teacher, w, rows))
    need = base + update_bytes(s, w, micro_batch or 1, options[-1])
    fix = ("lower training.micro_batch_size" if micro_batch > 1 else
           "set training.grad_checkpoint to auto or on" if checkpoint == "off" else
           "lower generation.max_new_tokens, quantize the base (model.quantize: 4)")
    raise ConfigError(f"the update of {micro_batch or 1} sequence(s) of {w.new_tokens} tokens "
                      f"needs about {gb(need)} GB, over the memory budget of {gb(budget)} GB: "
                      f"{fix} or raise training.max_memory_gb")


def pick_width(s: Shape, w: Work, room: int, width: int) -> int:
    """The decode width: `width` if set (checked), else the most rows up to P x G that fit."""
    if width:
        if decode_bytes(s, w, min(width, w.rows)) > room:
            raise ConfigError(f"decoding {width} sequences of {w.new_tokens} tokens needs about "
                              f"{gb(decode_bytes(s, w, width))} GB beside the weights, over "
                              "the memory budget: lower generation.completion_batch_size or "
                              "raise training.max_memory_gb")
        return width
    fits = [n for n in range(w.rows, 0, -1) if decode_bytes(s, w, n) <= room]
    if not fits:
        raise ConfigError(f"decoding one sequence of {w.new_tokens} tokens does not fit the "
                          "memory budget: lower generation.max_new_tokens or raise "
                          "training.max_memory_gb")
    return fits[0]


def pick_rows(s: Shape, w: Work, room: int, rows: int, checkpoint: bool,
              bounded: bool = False, aim: int = ACTIVATION_TARGET,
              teacher: Shape | None = None) -> int:
    """The micro-batch size: `rows` if set and it fits (else 0), else the most rows up to the
    update's that fit `room` with kept activations under `aim` (activation_aim): at least one,
    or, `bounded`, none where one row's are over it."""
    def fits(n: int) -> bool:
        return max(update_bytes(s, w, n, checkpoint), reference_bytes(s, w, n),
                   teacher_pass_bytes(teacher, w, n)) <= room

    if rows:
        return rows if fits(min(rows, w.train_rows)) else 0
    for n in range(w.train_rows, 0, -1):
        under = activation_bytes(s, w, n, checkpoint) <= aim
        if fits(n) and (under or (n == 1 and not bounded)):
            return n
    return 0


def gb(n: float) -> str:
    return f"{n / GiB:.2f}"


# --- the model's shapes ------------------------------------------------------------------------


def shape_of(model: nn.Module, fused_bytes: int = 0) -> Shape | None:
    """The shapes of a loaded mlx-lm model with its adapters (None where its text model's
    `args` do not name them): the heads from its arguments (a nested `text_config` too), what
    its blocks keep and its caches hold from its own layers (model_shape.py), full logits where
    the head does not split off."""
    a = text_args(model)
    names = ("hidden_size", "num_attention_heads", "vocab_size")
    if a is None or not all(isinstance(getattr(a, n, None), int) for n in names):
        return None
    heads = a.num_attention_heads
    head_dim = getattr(a, "head_dim", None) or a.hidden_size // heads
    params = tree_flatten(model.parameters())
    lora = sum(v.size for k, v in params if k.rsplit(".", 1)[-1] in ("lora_a", "lora_b"))
    weights = sum(v.nbytes for k, v in params if k.rsplit(".", 1)[-1] not in ("lora_a", "lora_b"))
    kernels = cpu.active()
    top_k = getattr(a, "num_experts_per_tok", None) or 1
    elems = layer_elems(model, a.hidden_size, top_k, 1 + (0 if kernels else UNFUSED_SWIGLU))
    kv, state = once(model, "caches", lambda: cache_sizes(model))
    return Shape(len(model.layers), a.hidden_size, getattr(a, "intermediate_size", None) or 0,
                 heads, getattr(a, "num_key_value_heads", None) or heads, head_dim,
                 a.vocab_size, weights, activation_itemsize(params), lora, fused_bytes, kernels,
                 kv_elems=kv, state_bytes=state, layer_elems=elems,
                 full_logits=once(model, "full_logits", lambda: split_head(model) is None))


def activation_itemsize(params: list[tuple[str, mx.array]]) -> int:
    """Bytes of the model's activations: the dtype of its quantization scales, else of its
    floating-point weights."""
    for suffix in ("scales", "weight"):
        for k, v in params:
            if k.endswith(suffix) and "lora" not in k and mx.issubdtype(v.dtype, mx.floating):
                return v.dtype.size
    return 4


# --- the limit a phase runs under ----------------------------------------------------------------


@contextlib.contextmanager
def limited(nbytes: int | None) -> Iterator[None]:
    """Within the block MLX's memory limit is `nbytes` (None: as it is). MLX's evaluation runs
    ahead of the computation by up to about a hundred operations, allocating their outputs;
    past the limit it waits for running work first. In the update that bounds the head's
    chunks in flight beside the activations (0.5B shape, 2 sequences of 256 tokens: MLX peak
    4.30 GB unlimited, 3.35 GB under the plan's limit, at the same speed: BENCHMARKS.md)."""
    if not nbytes:
        yield
        return
    before = mx.set_memory_limit(nbytes)
    try:
        yield
    finally:
        mx.set_memory_limit(before)


def phase_limit(s: Shape | None, w: Work, rows: int, checkpoint: bool, phase: str,
                held: int, budget: int = 0, streams: int = 1) -> int | None:
    """The MLX memory limit of a phase ("update" or "reference") over micro-batches of `rows`:
    the memory `held` now (weights, adapters, the optimizer's state) plus the phase's predicted
    bytes (`streams` micro-batches at once), never over a nonzero `budget`; None where the
    model's shapes are unknown."""
    if s is None:
        return None
    w = replace(w, chunk_mb=logits_chunk_mb(budget))
    need = (update_bytes(s, w, rows, checkpoint) if phase == "update"
            else streams * reference_bytes(s, w, rows))
    return min(held + need, budget) if budget else held + need


# --- the device -----------------------------------------------------------------------------------


def recommended_working_set() -> int | None:
    """MLX's recommended working set in bytes on Apple silicon (None elsewhere): the one device
    query the Metal-only code below is guarded by."""
    return mx.device_info().get("max_recommended_working_set_size")


def available_ram() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def device_budget(max_memory_gb: float = 0.0) -> tuple[int, str]:
    """(bytes, where they come from): the config's `max_memory_gb`, else HEADROOM of the
    device's own memory (Apple silicon: MLX's recommended working set; CUDA: the GPU's free
    memory: device.py) or, on the CPU, of the available RAM."""
    if max_memory_gb > 0:
        return int(max_memory_gb * GiB), "training.max_memory_gb"
    from .device import budget_base, current

    base = budget_base(current())  # a GPU's own memory (CUDA, Metal), not the host's RAM
    if base:
        return int(HEADROOM * base[0]), f"{HEADROOM:.0%} of {base[1]}"
    return int(HEADROOM * available_ram()), f"{HEADROOM:.0%} of the available RAM"


def set_device_limits(wired: int | None = None, cache: int | None = None) -> int | None:
    """MLX's buffer-cache limit (`cache` bytes, any device; None: as it is) and, on Apple
    silicon, the wired limit (`wired` bytes; None: raised to the recommended working set, as
    mlx-lm's `maybe_set_recommended_wired_limit` does); returns the previous wired limit (None
    elsewhere)."""
    if cache is not None:
        mx.set_cache_limit(cache)
    if not recommended_working_set():
        return None
    if wired is not None:
        return mx.set_wired_limit(wired)
    from mlx_lm.utils import maybe_set_recommended_wired_limit

    return maybe_set_recommended_wired_limit()


def clear_cache_if_large(budget: int) -> bool:
    """On Apple silicon, clear MLX's buffer cache when it holds more than CACHE_CLEAR_SHARE of
    `budget` bytes (mlx-lm's trainer's `_clear_cache`); returns whether it cleared."""
    if not recommended_working_set() or mx.get_cache_memory() <= CACHE_CLEAR_SHARE * budget:
        return False
    mx.clear_cache()
    return True
