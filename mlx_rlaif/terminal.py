"""Untrusted text on a terminal: control characters made visible.

Student code, completions, task files (ids, prompts: downloaded data) and a judge's rationale
can hold terminal control sequences: ESC starts CSI and OSC sequences (set the title, clear the
screen, and on terminals that honour OSC 52, write the clipboard), BEL ends OSC, CR overwrites
a line, and C1 characters (U+0080-U+009F) act as ESC on some terminals. Bidirectional overrides
(U+202A-U+202E, U+2066-U+2069) reorder what is shown. Everything that prints such text (the
dashboard, the plain log lines, `eval`, `validate`, `score`, `summary`, `data convert`,
`check-rewards`, `audit-judge`, `doctor`, error lines) passes it
through `visible()`, which writes each of these characters as its escape (`\\x1b`, `\\u202e`);
newlines and tabs stay, where a layout has room for them. Files (JSONL, datasets) keep the raw
text: `json_visible()` escapes them the JSON way, so a line decodes to the same value.

Not covered: what a terminal does with printable text (very long lines, homoglyphs).
"""

from __future__ import annotations

import logging

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
_BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]


def _escape(c: int) -> str:
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


_TABLE = {c: _escape(c) for c in (*_CONTROLS, *_BIDI)}
_TABLE_LAYOUT = {k: v for k, v in _TABLE.items() if k not in (0x09, 0x0A)}  # tab, newline stay
_JSON = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0), *_BIDI)}  # json escapes C0 itself


def visible(text: object, *, lines: bool = True) -> str:
    """`text` with every control character written as its escape; with `lines`, newlines and
    tabs are kept (a panel, a multi-line message), else they are escaped too (a table cell,
    a title, one log line's field)."""
    return str(text).translate(_TABLE_LAYOUT if lines else _TABLE)


def json_visible(line: str) -> str:
    """A JSON text (json.dumps with ensure_ascii=False) with the control characters JSON leaves
    raw (DEL, C1, bidirectional overrides) escaped as `\\uXXXX`: the same value decoded."""
    return line.translate(_JSON)


class VisibleFormatter(logging.Formatter):
    """A log formatter whose lines never carry control characters."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))
