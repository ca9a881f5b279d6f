"""Untrusted text on a terminal: control characters made visible.

Student code, completions, task files (ids, prompts: downloaded data) and a judge's rationale
can hold terminal control sequences: ESC starts CSI and OSC sequences (set the title, clear the
screen, and on terminals that honour OSC 52, write the clipboard), BEL ends OSC, CR overwrites
a line, and C1 characters (U+0080-U+009F) act as ESC on some terminals. Bidirectional overrides
(U+202A-U+202E, U+2066-U+2069, and the marks U+061C, U+200E, U+200F) reorder what is shown;
U+2028 and U+2029 separate lines where a viewer honours them; the other format characters
(Unicode category Cf: zero-width space, joiners, word joiner, BOM, soft hyphen, tags) are invisible
and hide what a line holds. Everything that prints such text (the
dashboard, the plain log lines, `eval`, `validate`, `score`, `summary`, `data convert`,
`check-rewards`, `audit-judge`, `doctor`, error lines) passes it
through `visible()`, which writes each of these characters as its escape (`\\x1b`, `\\u202e`,
and `\\n`, `\\t`, `\\r`); newlines and tabs stay only where a layout has room for them (a
completion in a panel), never in a line that could pass for the command's own (an error line, a
table cell: a user function's exception holding "\\nscored 9/9" stays on its line). Text printed
through rich goes in as `text()`, a `rich.text.Text` of the visible string: rich reads no markup
(`[link=...]`, `[/]`) and no emoji codes in it, so a task id cannot make a hyperlink or raise
rich's MarkupError. Files (JSONL, datasets) keep the raw text: `json_visible()` escapes them the
JSON way, so a line decodes to the same value.

Not covered: what a terminal does with printable text (very long lines, homoglyphs); format
characters added after Unicode 15 (the list is fixed here, checked against this Python's
unicodedata by tests/test_hostile_outputs.py).
"""

from __future__ import annotations

import logging
from typing import Any

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
# bidirectional overrides, embeddings, isolates and marks; line and paragraph separators
_BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x061C, 0x200E, 0x200F, 0x2028, 0x2029]
# every other format character (Unicode category Cf, as of Unicode 15): invisible, zero-width
_FORMAT_RANGES = ((0xAD, 0xAD), (0x600, 0x605), (0x6DD, 0x6DD), (0x70F, 0x70F), (0x890, 0x891),
                  (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200D), (0x2060, 0x2065),
                  (0x206A, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
                  (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
                  (0xE0001, 0xE0001), (0xE0020, 0xE007F))
_FORMAT = [c for a, b in _FORMAT_RANGES for c in range(a, b + 1)]
_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def _escape(c: int) -> str:
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


_TABLE = {c: _escape(c) for c in (*_CONTROLS, *_BIDI, *_FORMAT)}
_TABLE_LAYOUT = {k: v for k, v in _TABLE.items() if k not in (0x09, 0x0A)}  # tab, newline stay
_JSON = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0), *_BIDI)}  # json escapes C0 itself


def visible(text: object, *, lines: bool = True) -> str:
    """`text` with every control character written as its escape; with `lines`, newlines and
    tabs are kept (a panel, a multi-line message), else they are escaped too (a table cell,
    a title, one log line's field)."""
    return str(text).translate(_TABLE_LAYOUT if lines else _TABLE)


def text(value: object, *, lines: bool = False, style: str = "") -> Any:
    """`value` for rich: a `rich.text.Text` of `visible(value, lines=lines)`, which rich prints
    as it is (no markup, no emoji codes), in `style`."""
    from rich.text import Text

    return Text(visible(value, lines=lines), style=style)


def json_visible(line: str) -> str:
    """A JSON text (json.dumps with ensure_ascii=False) with the control characters JSON leaves
    raw (DEL, C1, bidirectional overrides) escaped as `\\uXXXX`: the same value decoded."""
    return line.translate(_JSON)


class VisibleFormatter(logging.Formatter):
    """A log formatter whose lines never carry control characters: the message is one line (a
    newline in it, from a user function's exception say, shows as `\\n`); a traceback logged
    with it keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return visible(super().formatMessage(record), lines=False)

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return visible(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return visible(super().formatStack(stack_info))
