"""The teacher reward: an LLM judge grading completions on a rubric. `reward.py` schedules the
calls and turns answers into rewards (samples averaged, rank positions corrected); `calls.py`
sends one request through the cache, the budget and the ledger; `startup.py` checks the config;
`judge.py` builds prompts and parses answers strictly; `clients.py` wraps the official SDKs;
`cache.py` keeps answers across runs; `strip.py` removes comments, `position.py` holds the rank
orders and position statistics; `audit.py`, `audit_report.py` and `variants.py` are the judge
audit (`mlx-rlaif audit-judge`)."""

from .reward import TeacherReward

__all__ = ["TeacherReward"]
