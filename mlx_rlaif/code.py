"""Pulling code out of a model's completion.

Covered: fenced blocks (```python ... ```), the first fenced block of the task's language winning
over other fences, and bare code. Not covered: several files in one answer.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+#-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_ALIASES = {
    "python": {"python", "py", "python3"},
    "cpp": {"cpp", "c++", "cxx", "cc"},
    "rust": {"rust", "rs"},
}


def extract_code(completion: str, language: str) -> str:
    """The code in `completion`: the first fence tagged with `language`, else the first fence,
    else the whole text."""
    blocks = _FENCE.findall(completion)
    if not blocks:
        return completion.strip("\n")
    names = _ALIASES.get(language, {language})
    for tag, body in blocks:
        if tag.lower() in names:
            return body.strip("\n")
    return blocks[0][1].strip("\n")
