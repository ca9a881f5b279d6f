"""A reward server for a scalar reward model: each completion's score is the model's mean
token probability of the completion given the prompt (exp of the mean log-probability: a
number in (0, 1]), computed with mlx-lm. Serve it, on this machine or another one:

    mlx-rlaif serve-reward examples/rewards/reward_model.py:score --port 8400 \\
        --kwarg model=builtin:tiny-coder

and point a component at it: `{kind: server, url: "http://127.0.0.1:8400/", weight: 0.2}`.
Which model is loaded is the operator's choice alone (`--kwarg model=...`, or the default
here): a request cannot set `model`, neither as a kwarg nor through a record's field.
A reward model of another kind (a sequence classifier) fits the same shape: load it once in
`_model`, return one number per completion from `score`.
"""

import functools
import math


@functools.cache
def _model(path: str):
    from mlx_lm import load

    from mlx_rlaif.assets import resolve_model

    return load(str(resolve_model(path)))


def score(prompts: list, completions: list, model: str = "builtin:tiny-coder") -> list:
    import mlx.core as mx
    import mlx.nn as nn

    lm, tokenizer = _model(model)
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        start = max(1, len(tokenizer.encode(prompt)))
        tokens = tokenizer.encode(prompt + completion)
        if len(tokens) <= start:
            out.append(None)  # nothing to score
            continue
        logits = lm(mx.array(tokens[:-1])[None])[0, start - 1:]
        logp = -nn.losses.cross_entropy(logits, mx.array(tokens[start:]))
        out.append(math.exp(float(logp.mean())))
    return out
