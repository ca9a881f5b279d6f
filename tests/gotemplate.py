"""A small subset of Go's text/template, enough to render the Ollama templates mlx-rlaif writes
(artifacts/modelfile.py) for tests: text, `{{ .Field }}`, `{{ if X }}...{{ else }}...{{ end }}`,
`{{ range .List }}...{{ end }}` (dot becomes the element), `eq`/`ne` on a field and a quoted
string, and the `{{-` / `-}}` whitespace trimming. Anything else raises ValueError, so a template
outside the subset fails the test instead of rendering wrongly.

Not covered: variables, pipelines, functions other than eq/ne, `else if`, `with`, comments.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)


def _tokens(template: str) -> list[tuple[str, str]]:
    """[("text", s) | ("action", s)], trimming applied."""
    out: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    for m in ACTION.finditer(template):
        text = template[pos:m.start()]
        if trim_next:
            text = text.lstrip()
        if m.group(1):
            text = text.rstrip()
        out.append(("text", text))
        out.append(("action", m.group(2)))
        trim_next, pos = bool(m.group(3)), m.end()
    tail = template[pos:]
    out.append(("text", tail.lstrip() if trim_next else tail))
    return out


def _parse(tokens: list[tuple[str, str]], i: int = 0) -> tuple[list, int, str | None]:
    """Nodes until an `else`/`end` (returned as the stop word) or the end."""
    nodes: list = []
    while i < len(tokens):
        kind, value = tokens[i]
        i += 1
        if kind == "text":
            nodes.append(("text", value))
            continue
        word = value.split(" ", 1)[0]
        if word in ("else", "end"):
            return nodes, i, word
        if word in ("if", "range"):
            body, i, stop = _parse(tokens, i)
            other: list = []
            if stop == "else":
                other, i, stop = _parse(tokens, i)
            if stop != "end":
                raise ValueError(f"{{{{ {value} }}}} has no end")
            nodes.append((word, value.split(" ", 1)[1], body, other))
        elif value.startswith("."):
            nodes.append(("value", value))
        else:
            raise ValueError(f"not in the subset: {{{{ {value} }}}}")
    return nodes, i, None


def _field(dot: Any, path: str) -> Any:
    if not path.startswith("."):
        raise ValueError(f"not a field: {path}")
    return dot.get(path[1:]) if isinstance(dot, dict) else None


def _eval(expr: str, dot: Any) -> Any:
    parts = shlex.split(expr, posix=True) if '"' in expr else expr.split()
    if len(parts) == 1:
        return _field(dot, parts[0])
    if len(parts) == 3 and parts[0] in ("eq", "ne"):
        left = _field(dot, parts[1])
        return (left == parts[2]) == (parts[0] == "eq")
    raise ValueError(f"not in the subset: {expr}")


def _render(nodes: list, dot: Any, out: list[str]) -> None:
    for node in nodes:
        if node[0] == "text":
            out.append(node[1])
        elif node[0] == "value":
            value = _eval(node[1], dot)
            out.append("" if value is None else str(value))
        elif node[0] == "if":
            _render(node[2] if _eval(node[1], dot) else node[3], dot, out)
        else:  # range
            items = _eval(node[1], dot) or []
            for item in items:
                _render(node[2], item, out)
            if not items:
                _render(node[3], dot, out)


def render(template: str, data: dict) -> str:
    nodes, _, stop = _parse(_tokens(template))
    if stop is not None:
        raise ValueError(f"unexpected {{{{ {stop} }}}}")
    out: list[str] = []
    _render(nodes, data, out)
    return "".join(out)
