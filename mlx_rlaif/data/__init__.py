"""Tasks: reading JSONL task files and the shipped suites (`suites/`), checking each record, and a
deterministic, resumable order over them (`tasks.py`)."""

from .tasks import TaskOrder, load_tasks, read_jsonl, task_from_record

__all__ = ["TaskOrder", "load_tasks", "read_jsonl", "task_from_record"]
