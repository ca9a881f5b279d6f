"""The teacher reward: an LLM judge grading completions on a rubric. `reward.py` schedules the
calls, keeps the ledger and the budget; `judge.py` builds prompts and parses answers strictly;
`clients.py` wraps the official SDKs; `cache.py` keeps answers across runs."""

from .reward import TeacherReward

__all__ = ["TeacherReward"]
