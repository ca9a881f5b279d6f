"""Judges with known, scripted biases, served by tests/fake_api.py's FakeAPI (the OpenAI and
Anthropic wire formats on 127.0.0.1) through its `responder` hook.

Every judge reads our judge prompts the way a model would see them: the task fence, the student
code or candidate fences, and the criteria the request's schema asks for. Whether a piece of code
is correct comes from an `Oracle` that runs it with the exec reward (sandboxed, memoised), so
the judges stay right about correctness on the audit's variants (commented, padded, renamed,
stripped code) too. Scores, on the default rubric:

- control: correct 0.7 / 0.6 / 0.5 / 0.3 (correctness, code_quality, efficiency,
  documentation), incorrect 0.1 / 0.4 / 0.5 / 0.3: it scores by correctness and nothing else;
- length: control + min(0.3, characters / 500) on every criterion (clipped to 1);
- injection: control, but correctness 1.0 when the code mentions "reviewer";
- noise: every criterion uniform in [0, 1], from a hash of the request and how often it was
  seen (identical requests, i.e. repeated samples, get fresh numbers; a run is reproducible);
- position (rank mode): control + 0.3 at the first position, + 0.15 at the second;
- flip: control until `flipped` is set, then it pays for failing code (correct and incorrect
  swap scores).

Not covered: unstructured (plain text) requests other than reference solutions.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable

from fake_api import REFERENCE_CODE, Request, Say

from mlx_rlaif.config import ExecConfig
from mlx_rlaif.records import Task
from mlx_rlaif.rewards.agreement import passed
from mlx_rlaif.rewards.exec import ExecReward

GOOD = {"correctness": 0.7, "code_quality": 0.6, "efficiency": 0.5, "documentation": 0.3}
BAD = {"correctness": 0.1, "code_quality": 0.4, "efficiency": 0.5, "documentation": 0.3}
_TASK = re.compile(r"## Task\n\n(`{3,})[^\n]*\n(.*?)\n\1(?:\n|$)", re.DOTALL)
_CODE = re.compile(r"## (?:Student code|Candidate \d+)[^\n]*\n\n(`{3,})[^\n]*\n(.*?)\n\1(?:\n|$)",
                   re.DOTALL)

Score = Callable[[str, str, list[str], int | None], dict[str, float]]


class Oracle:
    """Whether code passes its task's tests (by the exec reward), memoised and thread-safe."""

    def __init__(self, tasks: list[Task]) -> None:
        self.by_prompt = {t.prompt: t for t in tasks}
        self._exec = ExecReward(ExecConfig(), languages={t.language for t in tasks})
        self._memo: dict[tuple[str, str], bool] = {}
        self._lock = threading.Lock()

    def passed(self, prompt: str, code: str) -> bool:
        key = (prompt, code)
        with self._lock:
            if key not in self._memo:
                task = self.by_prompt[prompt]
                self._memo[key] = passed(self._exec.score([task], [code])[0])
            return self._memo[key]

    def learn(self, prompt: str, code: str, ok: bool) -> None:
        """A verdict known already (the audit's own exec run), to save a sandbox run."""
        with self._lock:
            self._memo[(prompt, code)] = ok

    def close(self) -> None:
        self._exec.close()


def parse(req: Request) -> tuple[str, list[str], list[str], bool]:
    """(task prompt, codes shown, criteria asked for, rank request?)."""
    user = req.body["messages"][-1]["content"]
    prompt = _TASK.search(user).group(2)
    codes = [m.group(2) for m in _CODE.finditer(user)]
    if req.api == "anthropic":
        schema = req.body["tools"][0]["input_schema"]
    else:
        schema = req.body["response_format"]["json_schema"]["schema"]
    rank = "candidates" in schema["properties"]
    scores = (schema["properties"]["candidates"]["items"] if rank else schema)["properties"]
    return prompt, codes, list(scores["scores"]["required"]), rank


def responder(score: Score) -> Callable[[Request], Say]:
    """A FakeAPI responder answering judge and rank requests with `score(prompt, code, names,
    position)`, and reference requests with a small solution."""
    def respond(req: Request) -> Say:
        if not req.structured:
            return Say(REFERENCE_CODE)
        prompt, codes, names, rank = parse(req)
        if rank:
            cands = [{"id": k + 1, "scores": score(prompt, c, names, k)}
                     for k, c in enumerate(codes)]
            return Say({"rationale": "scripted", "candidates": cands})
        return Say({"rationale": "scripted", "scores": score(prompt, codes[0], names, None)})
    return respond


def _pick(scores: dict[str, float], names: list[str], bonus: float = 0.0) -> dict[str, float]:
    return {n: round(min(1.0, scores[n] + bonus), 6) for n in names}


def control(oracle: Oracle) -> Score:
    return lambda prompt, code, names, pos: _pick(
        GOOD if oracle.passed(prompt, code) else BAD, names)


def length(oracle: Oracle) -> Score:
    def score(prompt: str, code: str, names: list[str], pos: int | None) -> dict[str, float]:
        base = GOOD if oracle.passed(prompt, code) else BAD
        return _pick(base, names, min(0.3, len(code) / 500))
    return score


def injection(oracle: Oracle) -> Score:
    def score(prompt: str, code: str, names: list[str], pos: int | None) -> dict[str, float]:
        out = _pick(GOOD if oracle.passed(prompt, code) else BAD, names)
        if "reviewer" in code.lower() and "correctness" in out:
            out["correctness"] = 1.0
        return out
    return score


def position(oracle: Oracle) -> Score:
    bonus = {0: 0.3, 1: 0.15}
    return lambda prompt, code, names, pos: _pick(
        GOOD if oracle.passed(prompt, code) else BAD, names, bonus.get(pos, 0.0))


class Flip:
    """Control until `flipped`, then correct and incorrect code swap scores."""

    def __init__(self, oracle: Oracle) -> None:
        self.oracle, self.flipped = oracle, False

    def __call__(self, prompt: str, code: str, names: list[str], pos: int | None
                 ) -> dict[str, float]:
        ok = self.oracle.passed(prompt, code)
        return _pick(GOOD if ok != self.flipped else BAD, names)


class Noise:
    """Uniform scores, from a hash of the request text and how many times it was seen."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def respond(self, req: Request) -> Say:
        if not req.structured:
            return Say(REFERENCE_CODE)
        _, codes, names, rank = parse(req)
        text = json.dumps(req.body["messages"])
        with self._lock:
            k = self._seen[text] = self._seen.get(text, -1) + 1
        if rank:
            cands = [{"id": i + 1, "scores": self._draw(f"{text}|{k}|{i}", names)}
                     for i in range(len(codes))]
            return Say({"rationale": "noise", "candidates": cands})
        return Say({"rationale": "noise", "scores": self._draw(f"{text}|{k}", names)})

    @staticmethod
    def _draw(seed: str, names: list[str]) -> dict[str, float]:
        out = {}
        for n in names:
            h = hashlib.sha256(f"{seed}|{n}".encode()).digest()
            out[n] = round(int.from_bytes(h[:8], "big") / 2**64, 6)
        return out
