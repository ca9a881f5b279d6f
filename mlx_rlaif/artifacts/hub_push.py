"""Model exports on the Hugging Face Hub: a model card, and `--push REPO` for fuse, export-peft
and export-gguf.

The card (README.md, beside the exported files) says what a reader needs to trust the model: the
base model, the recipe (algorithm, reward, teacher, LoRA, steps), the training and held-out data's
names and the held-out pass@1 before and after training, read from the run directory the
checkpoint belongs to (`config.yaml` of the checkpoint, the run's `eval.json`). A figure the run
did not record is left out, never guessed. Every value from a path or a config (the base, the
recipe, the data files, the file names) is written as a code span on one line: a newline in it
shows as `\\n`, so a hostile path adds no heading, front matter or link.

The upload is `huggingface_hub`'s `create_repo` + `upload_folder`. The token comes from the
environment (HF_TOKEN or HUGGINGFACE_TOKEN, else huggingface_hub's own login) and is never
written anywhere; the repository is private unless `private=False` (`--public`).

Not covered: pull requests, branches other than main, deleting files already in the repo.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import RlaifError, UsageError
from ..terminal import visible

CARD = "README.md"


def run_dir_of(adapter_dir: Path) -> Path | None:
    """RUN for RUN/checkpoints/NAME, else None (a bare adapter directory)."""
    adapter_dir = Path(adapter_dir).resolve()
    return adapter_dir.parent.parent if adapter_dir.parent.name == "checkpoints" else None


def run_config(adapter_dir: Path) -> dict[str, Any]:
    """The run's config as saved with the checkpoint (config.yaml), {} when there is none."""
    import yaml

    for path in (Path(adapter_dir) / "config.yaml",
                 *(([run_dir_of(adapter_dir) / "config.yaml"]) if run_dir_of(adapter_dir) else [])):
        if path.is_file():
            loaded = yaml.safe_load(path.read_text())
            return loaded if isinstance(loaded, dict) else {}
    return {}


def held_out(adapter_dir: Path) -> dict[str, Any]:
    """The run's eval.json ({"before": {...}, "after": {...}}), {} when it has none."""
    run = run_dir_of(adapter_dir)
    path = run / "eval.json" if run else None
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _get(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


RECIPE = (
    ("algorithm", "rl.advantage"), ("loss", "rl.loss"), ("reward", "reward.type"),
    ("teacher", "reward.teacher.model"), ("samples per prompt", "generation.num_samples_per_prompt"),
    ("KL penalty", "rl.kl_penalty"), ("learning rate", "training.learning_rate"),
    ("LoRA rank", "lora.rank"), ("max steps", "training.max_steps"),
)


def code(value: object) -> str:
    """`value` as a markdown code span on one line: control characters (newlines) escaped, fenced
    by more backticks than it holds."""
    text = visible(value, lines=False)
    fence = "`" * (1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    pad = " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def model_card(kind: str, base: str, cfg: Mapping[str, Any], evals: Mapping[str, Any],
               files: list[str]) -> str:
    """README.md for an exported model: front matter (base_model, tags), then what it is."""
    data = [d for d in (_get(cfg, "data.train_file"), _get(cfg, "data.eval_file")) if d]
    lines = ["---", f"base_model: {json.dumps(base)}",
             "library_name: " + {"gguf": "gguf", "peft": "peft"}.get(kind, "mlx"),
             "tags:", "- mlx-rlaif", "- code", "- reinforcement-learning"]
    lines += [f"- {kind}", "---", "",
              f"# {kind.upper() if kind == 'gguf' else kind.title()} export of a model "
              "fine-tuned with mlx-rlaif", "",
              f"Base model: {code(base)}. LoRA adapters trained with RL from AI feedback "
              "(mlx-rlaif), " + ("fused into the base." if kind != "peft" else "in PEFT format."),
              ""]
    recipe = [(label, v) for label, key in RECIPE if (v := _get(cfg, key)) not in (None, "")]
    if recipe:
        lines += ["## Recipe", "", *[f"- {label}: {code(v)}" for label, v in recipe], ""]
    if data:
        lines += ["## Data", "", *[f"- {code(d)}" for d in data], ""]
    rows = [(w, evals[w]) for w in ("before", "after") if isinstance(evals.get(w), Mapping)]
    if rows:
        lines += ["## Held-out pass@1", "", "| | pass@1 | tasks |", "|---|---|---|"]
        lines += [f"| {w} training | {r.get('pass@1', float('nan')):.3f} | {r.get('tasks', '')} |"
                  for w, r in rows]
        lines.append("")
    lines += ["## Files", "", *[f"- {code(f)}" for f in sorted(files)], ""]
    return "\n".join(lines)


def write_card(folder: Path, kind: str, base: str, adapter_dir: Path) -> Path:
    """README.md into `folder`, from the run `adapter_dir` belongs to."""
    files = [p.name for p in Path(folder).iterdir() if p.name != CARD]
    text = model_card(kind, base, run_config(adapter_dir), held_out(adapter_dir), files)
    (Path(folder) / CARD).write_text(text)
    return Path(folder) / CARD


def push(folder: Path, repo: str, private: bool = True, what: str = "model") -> str:
    """Upload `folder` to the Hub model repo `repo` (created private unless private=False).
    Returns the repo's URL. The token comes from the environment only."""
    if "/" not in repo or repo.count("/") > 1:
        raise UsageError(f"--push {repo}: name the repo as OWNER/NAME")
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        raise UsageError("--push needs huggingface_hub: pip install huggingface_hub") from None
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGINGFACE_TOKEN") or None
    api = HfApi(token=token)
    try:
        url = api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model",
                          commit_message=f"Upload {what} exported by mlx-rlaif")
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", "?")
        raise RlaifError(f"push to {repo} failed (HTTP {status}): check that HF_TOKEN or "
                         "HUGGINGFACE_TOKEN holds a token with write access") from None
    except OSError as e:  # no route, refused, DNS
        raise RlaifError(f"push to {repo} failed ({type(e).__name__}): the Hub could not be "
                         "reached; the export is kept, push again later") from None
    return str(url)
