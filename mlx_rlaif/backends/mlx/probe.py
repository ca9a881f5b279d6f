"""A model's first use at load: errors raised inside mlx-lm's model code as one line.

An architecture can load and still fail inside mlx-lm the first time it computes: an
operation the device does not support in the weights' dtype, a head that multiplies by a
quantized (packed) weight. Met halfway through the first step that is a raw traceback from deep
inside the rollout or the loss. `probe(model)` runs, right after the LoRA layers are added, the
two things a step will do on a 3-token input: a forward pass through mlx-lm's prompt cache (the
rollout's path; the memory plan reads the cache's sizes from it: model_shape.py) and a forward
and backward pass for the trainable parameters (the update's); any error is raised as a
UsageError of one line (`failure_line`) naming the model type, the mlx-lm version, the failing
operation (MLX's primitive and the innermost line of mlx-lm's model code) and a fix. `load_failure_line` does
the same for an error raised inside mlx-lm's model code while loading.

Not covered: failures that only longer inputs or wider batches reach (a sliding window, a
batched cache): the probe runs one row of a few tokens.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ...errors import UsageError
from .model_shape import once, sizes_of

PROBE_TOKENS = [[1, 2, 3]]


def mlx_lm_version() -> str:
    import mlx_lm

    return getattr(mlx_lm, "__version__", "?")


def model_frame(e: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of `e`'s traceback in mlx-lm's model code (mlx_lm/models/)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if Path(f.filename).parent.name == "models"
              and Path(f.filename).parent.parent.name == "mlx_lm"]
    return frames[-1] if frames else None


def operation(e: BaseException) -> str:
    """Where `e` arose, in words: MLX's primitive (`[GatherMM::eval]` -> GatherMM) and/or the
    innermost line of mlx-lm's model code."""
    parts = []
    primitive = re.match(r"\[(\w+)::", str(e))
    if primitive:
        parts.append(primitive.group(1))
    frame = model_frame(e)
    if frame is not None:
        parts.append(f"{Path(frame.filename).name}:{frame.lineno} `{(frame.line or '').strip()}`")
    return " in ".join(parts) or "its forward pass"


def fix_for(e: BaseException, quantized: bool, model_type: str, when: str) -> str:
    text = str(e)
    if when == "at load":
        return (f"check the model's config.json against mlx-lm's models/{model_type}.py, or "
                "try another mlx-lm version")
    if "GatherMM" in text and not quantized:
        return ("its experts' product runs only in float32 on this device: quantize the base "
                "(model.quantize: 4) or convert the weights to float32")
    if quantized:
        return ("this architecture fails on quantized weights in this mlx-lm: train the "
                "unquantized checkpoint (model.quantize: 0) or another mlx-lm version")
    return "try another mlx-lm version, or report it to mlx-lm with this line"


def first_line(e: BaseException) -> str:
    """An exception's message up to its first line break ("" for none)."""
    return str(e).splitlines()[0] if str(e) else ""


def failure_line(e: BaseException, model_type: str, quantized: bool, when: str) -> str:
    """The one line an error raised inside mlx-lm's model code becomes."""
    first = first_line(e)
    return (f"the {model_type} model fails {when} in mlx-lm {mlx_lm_version()} (mlx "
            f"{mx.__version__}) at {operation(e)} ({type(e).__name__}: {first}): "
            f"{fix_for(e, quantized, model_type, when)}")


def load_failure_line(e: BaseException) -> str | None:
    """`failure_line` for an error raised inside mlx-lm's model code while loading (None: the
    error came from elsewhere, e.g. a wrong path)."""
    frame = model_frame(e)
    if frame is None:
        return None
    return failure_line(e, Path(frame.filename).stem, False, "at load")


def model_type_of(model: nn.Module) -> str:
    args = getattr(model, "args", None)
    return (getattr(model, "model_type", None) or getattr(args, "model_type", None)
            or type(model).__module__.rsplit(".", 1)[-1])


def probe(model: nn.Module, quantized: bool, train: bool = True, name: str = "") -> None:
    """Run the model once as a step will (a forward pass through the prompt cache; with
    `train`, a forward and backward pass for the trainable parameters; a frozen teacher runs
    the forward only); UsageError of one line where mlx-lm fails, after `name` (who it is)."""
    from mlx_lm.models.cache import make_prompt_cache

    x = mx.array(PROBE_TOKENS)
    try:
        cache = make_prompt_cache(model)
        mx.eval(model(x, cache=cache))
        once(model, "caches", lambda: sizes_of(cache))  # the memory plan's, measured here
        if train:
            loss, grads = nn.value_and_grad(model, lambda m: m(x).astype(mx.float32).mean())(
                model)
            mx.eval(loss, grads)
    except Exception as e:  # noqa: BLE001  (whatever mlx-lm's model code raises)
        raise UsageError(name + failure_line(e, model_type_of(model), quantized, "at first use")
                         ) from e
