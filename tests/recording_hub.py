"""A metrics hub that records what the loop sends (the loop's side of the MetricsHub interface)."""

from __future__ import annotations


class RecordingHub:
    def __init__(self) -> None:
        self.steps: list[tuple[int, dict]] = []
        self.samples: list[dict] = []
        self.messages: list[str] = []
        self.epochs: list[int] = []
        self.evals: list[tuple[int, dict]] = []

    def log_step(self, step: int, metrics: dict) -> None:
        self.steps.append((step, dict(metrics)))

    def log_samples(self, step: int, samples: list[dict]) -> None:
        self.samples.extend(samples)

    def log_eval(self, step: int, row: dict) -> None:
        self.evals.append((step, dict(row)))

    def end_epoch(self, epoch: int) -> dict:
        self.epochs.append(epoch)
        return {}

    def set_baseline(self, value: float, source: str) -> None:
        self.baseline = (value, source)

    def message(self, text: str) -> None:
        self.messages.append(text)

    def stats(self) -> dict:
        return {"steps": len(self.steps)}

    def close(self) -> str:
        return ""
