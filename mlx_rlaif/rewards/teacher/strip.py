"""Code with its comments removed, for judging what it does (`reward.teacher.strip_comments`).

Covered:
- Python, with the standard library's `tokenize`: every `#` comment goes (a line left empty by
  that goes too); a statement that is only a plain string literal (docstrings, and any other
  bare string: neither does anything when run) goes, replaced by `pass` where it was the only
  statement of its block. Everything else keeps its exact text and indentation, so a body
  completion (an indented fragment) stays a fragment. Code that `tokenize` rejects (an
  unterminated string, bad indentation) loses only its lines that start with `#`;
- C++ and Rust, with a small lexer: `//` and `/* ... */` comments go (Rust: doc comments
  `///`, `//!` and nested block comments included), string and character literals (C++ raw
  strings `R"x(...)x"`, Rust raw strings `r#"..."#`, Rust lifetimes, C++ digit separators) are
  kept as written; a line left empty goes. Preprocessor lines and macros are left as written;
- any other language: unchanged.

Not covered: text that talks to the reviewer through identifiers, string values that are used,
or f-strings (a bare f-string can run code, so it is kept); the stripped code is only shown to
the judge, never run.
"""

from __future__ import annotations

import io
import re
import token
import tokenize


def strip_comments(code: str, language: str) -> str:
    if language == "python":
        return strip_python(code)
    if language in ("cpp", "rust"):
        return strip_c_like(code, rust=language == "rust")
    return code


# --- Python ----------------------------------------------------------------------------------


def strip_python(code: str) -> str:
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return _drop_hash_lines(code)
    lines = code.splitlines(keepends=True)
    drop: set[int] = set()  # 0-based line numbers to delete
    cut: dict[int, int] = {}  # line -> column where a comment starts
    replace: dict[int, str] = {}  # line -> new text
    for t in toks:
        if t.type == tokenize.COMMENT:
            row = t.start[0] - 1
            if lines[row][: t.start[1]].strip():
                cut[row] = t.start[1]
            else:
                drop.add(row)
    for first, last, only in _bare_strings(toks, lines):
        rows = range(first, last + 1)
        drop.update(rows)
        if only:
            indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
            replace[first] = f"{indent}pass\n"
    out = []
    for i, line in enumerate(lines):
        if i in replace:
            out.append(replace[i])
        elif i in drop:
            continue
        elif i in cut:
            ending = "\n" if line.endswith("\n") else ""
            out.append(line[: cut[i]].rstrip() + ending)
        else:
            out.append(line)
    return "".join(out)


def _drop_hash_lines(code: str) -> str:
    return "".join(ln for ln in code.splitlines(keepends=True) if not ln.lstrip().startswith("#"))


_SKIP = {tokenize.NL, tokenize.COMMENT}


def _logical_lines(toks: list[tokenize.TokenInfo]) -> list[tuple[int, list, int]]:
    """(index of the token before the line, the line's significant tokens, index of the token
    after its NEWLINE) for each logical line."""
    out: list[tuple[int, list, int]] = []
    start = None
    between = _SKIP | {tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for i, t in enumerate(toks):
        if start is None and t.type in between:
            continue
        if start is None:
            start = i
        if t.type == tokenize.NEWLINE:
            sig = [x for x in toks[start:i] if x.type not in _SKIP]
            out.append((start - 1, sig, i + 1))
            start = None
    return out


def _bare_strings(toks: list[tokenize.TokenInfo], lines: list[str]
                  ) -> list[tuple[int, int, bool]]:
    """(first line, last line, only statement of its block) of each statement that is nothing
    but plain string literals on lines of its own."""
    found = []
    for before, sig, after in _logical_lines(toks):
        if not sig or any(t.type != token.STRING for t in sig):
            continue
        first, last = sig[0].start[0] - 1, sig[-1].end[0] - 1
        if lines[first][: sig[0].start[1]].strip() or _rest(lines[last], sig[-1].end[1]):
            continue  # shares a line with code: leave it
        opens = before >= 0 and toks[before].type == tokenize.INDENT
        nxt = next((t for t in toks[after:] if t.type not in _SKIP), None)
        closes = nxt is None or nxt.type in (tokenize.DEDENT, tokenize.ENDMARKER)
        found.append((first, last, opens and closes))
    return found


def _rest(line: str, col: int) -> bool:
    """Code (not a comment) after column `col`."""
    rest = line[col:].strip()
    return bool(rest) and not rest.startswith("#")


# --- C++ and Rust ----------------------------------------------------------------------------

_RUST_CHAR = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]{1,6}\}|x[0-9a-fA-F]{2}|.)|[^'\\\n])'")
_CPP_RAW = re.compile(r'R"([^()\\\s]{0,16})\(')
_RUST_RAW = re.compile(r'b?r(#*)"')


def strip_c_like(code: str, rust: bool) -> str:
    """`//` and `/* */` comments removed (newlines inside a block comment kept, so lines keep
    their numbers), literals untouched; lines that only held comments dropped."""
    out: list[str] = []
    i, n = 0, len(code)
    while i < n:
        j = _literal_end(code, i, rust)
        if j > i:
            out.append(code[i:j])
            i = j
        elif code.startswith("//", i):
            nl = code.find("\n", i)
            i = n if nl < 0 else nl
            out.append("\0")  # marks a line that held a comment
        elif code.startswith("/*", i):
            end = _block_end(code, i, rust)
            out.append("\0" + "\n\0" * code.count("\n", i, end) + " ")
            i = end
        else:
            out.append(code[i])
            i += 1
    return _tidy("".join(out))


def _tidy(text: str) -> str:
    lines = []
    for line in text.splitlines(keepends=True):
        if "\0" not in line:
            lines.append(line)
            continue
        body = line.replace("\0", "")
        if body.strip():
            lines.append(body.rstrip() + ("\n" if line.endswith("\n") else ""))
    return "".join(lines)


def _block_end(code: str, i: int, rust: bool) -> int:
    depth, j = 0, i
    while j < len(code):
        if code.startswith("/*", j):
            depth += 1 if rust or depth == 0 else 0
            j += 2
        elif code.startswith("*/", j):
            depth -= 1
            j += 2
            if depth <= 0:
                return j
        else:
            j += 1
    return len(code)


def _literal_end(code: str, i: int, rust: bool) -> int:
    """End of a string/char literal starting at `i`, or `i` when none starts there."""
    c = code[i]
    prev = code[i - 1] if i else ""
    if not (prev.isalnum() or prev == "_"):
        raw = (_RUST_RAW if rust else _CPP_RAW).match(code, i)
        if raw:
            close = ('"' + raw.group(1)) if rust else (")" + raw.group(1) + '"')
            end = code.find(close, raw.end())
            return len(code) if end < 0 else end + len(close)
    if c == '"':
        return _quoted_end(code, i, '"')
    if c == "'":
        if rust:
            m = _RUST_CHAR.match(code, i)
            return m.end() if m else i + 1  # a lifetime: just the quote
        if prev.isalnum():
            return i + 1  # a C++14 digit separator
        return _quoted_end(code, i, "'")
    return i


def _quoted_end(code: str, i: int, quote: str) -> int:
    j = i + 1
    while j < len(code):
        if code[j] == "\\":
            j += 2
        elif code[j] == quote or code[j] == "\n":
            return j + 1
        else:
            j += 1
    return len(code)
