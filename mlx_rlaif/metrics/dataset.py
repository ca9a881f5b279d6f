"""The collected dataset: every scored completion as a record in `datasets/{train,validation,
evaluation}.jsonl`, a dataset card (`README.md`) whose YAML front matter lets
`datasets.load_dataset(DIR)` load the folder with a fixed schema, and the push to the Hub.

Record fields follow the seed trainer (prompt, language, student_code, teacher_code, student_score,
teacher_score, reward, scoring_breakdown, timestamp) plus task_id, completion, advantage, reason,
rationale, truncated and step. Covered: the schema is declared in the card (`dataset_info`), so
splits whose columns are all null, or reward parts that appear only in some rows, still load.
Not covered: deduplication of steps a resumed run did again; private-repo settings on push.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from ..errors import RlaifError, UsageError
from ..records import extract_code
from .jsonl import JsonlWriter, atomic_write, complete_lines, dumps, read_jsonl
from .stats import finite

SPLITS = ("train", "validation", "evaluation")

# column -> arrow dtype, in order; `scoring_breakdown` is a struct of float64 added per run
FEATURES: dict[str, str] = {
    "task_id": "string",
    "prompt": "string",
    "language": "string",
    "student_code": "string",
    "completion": "string",
    "teacher_code": "string",
    "student_score": "float64",
    "teacher_score": "float64",
    "reward": "float64",
    "advantage": "float64",
    "reason": "string",
    "rationale": "string",
    "truncated": "bool",
    "step": "int64",
    "timestamp": "timestamp[s]",
}


def to_row(sample: Mapping[str, Any], timestamp: str | None) -> dict[str, Any]:
    """A per-completion sample (as the training loop logs it) -> a dataset record."""
    language = str(sample.get("language") or "python")
    completion = str(sample.get("completion") or "")
    parts = sample.get("parts") or {}
    reward = finite(sample.get("reward"))
    return {
        "task_id": str(sample.get("task_id", "")),
        "prompt": str(sample.get("prompt", "")),
        "language": language,
        "student_code": extract_code(completion, language),
        "completion": completion,
        "teacher_code": sample.get("teacher_code"),
        "student_score": finite(sample.get("student_score", reward)),
        "teacher_score": finite(sample.get("teacher_score")),
        "reward": reward,
        "advantage": finite(sample.get("advantage")),
        "reason": str(sample.get("reason") or ""),
        "rationale": sample.get("rationale"),
        "truncated": bool(sample.get("truncated", False)),
        "step": int(sample.get("step") or 0),
        "timestamp": timestamp,
        "scoring_breakdown": {str(k): finite(v) for k, v in parts.items()} or None,
    }


def split_of(sample: Mapping[str, Any]) -> str:
    split = sample.get("split", "train")
    return split if split in SPLITS else "train"


class DatasetWriter:
    """Appends records to the split files as samples arrive; `close()` writes the card."""

    def __init__(self, folder: Path, append: bool, meta: Mapping[str, Any]) -> None:
        self.folder, self.meta = folder, dict(meta)
        self._writers = {s: JsonlWriter(folder / f"{s}.jsonl", append) for s in SPLITS}

    def add(self, samples: Iterable[Mapping[str, Any]]) -> None:
        now = datetime.now().isoformat(timespec="seconds")
        for sample in samples:
            self._writers[split_of(sample)].write(to_row(sample, now))

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        if any(w.path.is_file() for w in self._writers.values()):
            write_card(self.folder, self.meta)


def split_counts_and_parts(folder: Path) -> tuple[dict[str, int], list[str]]:
    counts, parts = {}, set()
    for split in SPLITS:
        rows = read_jsonl(folder / f"{split}.jsonl")
        if rows:
            counts[split] = len(rows)
        for r in rows:
            parts.update((r.get("scoring_breakdown") or {}).keys())
    return counts, sorted(parts)


def card_metadata(counts: Mapping[str, int], parts: list[str], meta: Mapping[str, Any]) -> dict:
    features: list[dict] = [{"name": k, "dtype": v} for k, v in FEATURES.items()]
    features.append(
        {"name": "scoring_breakdown", "struct": [{"name": p, "dtype": "float64"} for p in parts]}
        if parts
        else {"name": "scoring_breakdown", "dtype": "null"}
    )
    files = [{"split": s, "path": f"{s}.jsonl"} for s in SPLITS if counts.get(s)]
    out = {
        "configs": [{"config_name": "default", "data_files": files}],
        "dataset_info": {"features": features},
        "tags": ["code", "rlaif", "mlx-rlaif"],
        "task_categories": ["text-generation"],
    }
    if meta:
        out["mlx_rlaif"] = dict(meta)
    return out


def card_text(counts: Mapping[str, int], parts: list[str], meta: Mapping[str, Any]) -> str:
    front = yaml.safe_dump(card_metadata(counts, parts, meta), sort_keys=False)
    lines = [
        "---",
        front.rstrip(),
        "---",
        "",
        "# mlx-rlaif dataset",
        "",
        "Completions sampled during an mlx-rlaif RL run, with their scores.",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "| split | records |", "|---|---|"]
    lines += [f"| {s} | {counts[s]} |" for s in SPLITS if s in counts]
    lines += [
        "",
        "Fields: prompt, language, student_code (code extracted from the completion), "
        "completion (raw), teacher_code (reference by the teacher, if any), student_score "
        "(the completion's reward), teacher_score, reward (null: unscorable), advantage, "
        f"scoring_breakdown ({', '.join(parts) or 'none'}), reason, rationale (the judge's), "
        "truncated, step, timestamp.",
        "",
        "```python",
        "from datasets import load_dataset",
        'ds = load_dataset("path/or/repo")',
        "```",
        "",
    ]
    return "\n".join(lines)


def write_card(folder: Path, meta: Mapping[str, Any]) -> dict[str, int]:
    counts, parts = split_counts_and_parts(folder)
    atomic_write(folder / "README.md", card_text(counts, parts, meta))
    return counts


def read_card_meta(folder: Path) -> dict:
    card = folder / "README.md"
    if not card.is_file():
        return {}
    text = card.read_text(encoding="utf-8")
    if not text.startswith("---"):
        return {}
    front = yaml.safe_load(text.split("---", 2)[1]) or {}
    return dict(front.get("mlx_rlaif") or {})


def export(run_dir: Path, out: Path) -> dict[str, int]:
    """Write a loadable dataset folder from a run: its `datasets/` files, or, when the run did
    not collect them, the records in `samples.jsonl`. Returns records per split. The folder is
    written beside `out` and renamed into place (a new or empty `out`), or its files are each
    replaced (a folder already holding files): an error leaves `out` as it was."""
    from ..artifacts.atomic import atomic_dir, check_out_dir

    src = run_dir / "datasets"
    if any((src / f"{s}.jsonl").is_file() for s in SPLITS):
        for s in SPLITS:  # a broken line is named in the run's file, before anything is written
            read_jsonl(src / f"{s}.jsonl")
    elif not (run_dir / "samples.jsonl").is_file():
        raise UsageError(
            f"{run_dir} has neither datasets/ nor samples.jsonl: pass a run "
            "directory (training.output_dir) of a run that logged samples"
        )
    if not (out.is_dir() and any(out.iterdir())):
        with atomic_dir(check_out_dir(out)) as tmp:
            return _export_into(run_dir, tmp)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.tmp-") as t:
        counts = _export_into(run_dir, Path(t))
        for name in (*(f"{s}.jsonl" for s in SPLITS), "README.md"):
            if (Path(t) / name).is_file():
                os.replace(Path(t) / name, out / name)
            else:
                (out / name).unlink(missing_ok=True)
    return counts


def _export_into(run_dir: Path, out: Path) -> dict[str, int]:
    src = run_dir / "datasets"
    if any((src / f"{s}.jsonl").is_file() for s in SPLITS):
        meta = read_card_meta(src)
        for s in SPLITS:
            _copy_atomic(src / f"{s}.jsonl", out / f"{s}.jsonl")
    else:
        meta = {}
        _rows_from_samples(read_jsonl(run_dir / "samples.jsonl"), out)
    counts = write_card(out, meta)
    if not counts:
        raise UsageError(f"{run_dir}: the run collected no records, so there is nothing to export")
    return counts


def _copy_atomic(src: Path, dst: Path) -> None:
    if src.is_file():  # without a torn last line a crash may have left
        atomic_write(dst, complete_lines(src.read_bytes()))
    else:
        dst.unlink(missing_ok=True)


def _rows_from_samples(samples: list[dict], out: Path) -> None:
    by_split: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for sample in samples:
        by_split[split_of(sample)].append(to_row(sample, sample.get("timestamp") or None))
    for s, rows in by_split.items():
        path = out / f"{s}.jsonl"
        if rows:
            atomic_write(path, "".join(dumps(r) + "\n" for r in rows))
        else:
            path.unlink(missing_ok=True)


def push(folder: Path, repo: str, private: bool = False) -> str:
    """Upload the folder to a Hugging Face dataset repo; the token comes from HF_TOKEN or
    HUGGINGFACE_TOKEN (or huggingface_hub's own login). Returns the repo URL."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise UsageError("--push needs huggingface_hub: pip install huggingface_hub") from None
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGINGFACE_TOKEN") or None
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    try:
        url = api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
        api.upload_folder(
            folder_path=str(folder),
            repo_id=repo,
            repo_type="dataset",
            commit_message="Upload mlx-rlaif dataset",
        )
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", "?")
        raise RlaifError(
            f"push to {repo} failed (HTTP {status}): check that HF_TOKEN or "
            "HUGGINGFACE_TOKEN holds a token with write access"
        ) from None
    return str(url)
