"""How Ollama reads a Modelfile, for tests: a reading of its parser's grammar (ollama/ollama,
parser/parser.go, `ParseFile`), written here as a small state machine, so a test can check that
the Modelfile mlx-rlaif writes (artifacts/modelfile.py) is read back as the commands it meant.

The grammar as that parser has it: a line starts with a command word (letters; `#` starts a
comment line), `PARAMETER` takes a name (letters, digits, `_`), then one space and the value.
The value runs to the first line end at which the text so far, stripped of spaces, is complete:
unquoted, `"..."` (starts and ends with `"`) or `\"\"\"...\"\"\"` (starts and ends with three,
six characters at least); an incomplete quoted value takes the line end into itself and goes
on. Nothing is unescaped, and a character that is not printable (Go's strconv.IsPrint; space,
tab and the line ends kept inside a value) is dropped.

Not covered: the command words' own checks (MESSAGE roles, REQUIRES versions), what
`ollama create` does with the values afterwards.
"""

from __future__ import annotations

COMMANDS = {"from", "license", "template", "system", "adapter", "draft", "renderer", "parser",
            "parameter", "message", "requires"}
_NIL, _NAME, _VALUE, _PARAM, _COMMENT = range(5)
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007" \
            "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


class ModelfileError(ValueError):
    """What Ollama would refuse to read."""


def _unquote(s: str) -> tuple[str, bool]:
    if s.startswith('"""'):
        return (s[3:-3], True) if len(s) >= 6 and s.endswith('"""') else ("", False)
    if s.startswith('"'):
        return (s[1:-1], True) if len(s) >= 2 and s.endswith('"') else ("", False)
    return s, True


def _next(c: str, state: int) -> tuple[int, str]:
    """(the next state, the character to keep or '') for `c` in `state`."""
    space, newline = c in " \t", c in "\r\n"
    if state == _NIL:
        return (_COMMENT, "") if c == "#" else (_NIL, "") if space or newline else (_NAME, c)
    if state == _NAME:
        if c.isascii() and c.isalpha():
            return _NAME, c
        if space:
            return _VALUE, ""
        raise ModelfileError(f"invalid command at {c!r}")
    if state == _PARAM:
        if c.isascii() and (c.isalnum() or c == "_"):
            return _PARAM, c
        if space:
            return _VALUE, ""
        raise ModelfileError("unexpected end of a parameter name")
    if state == _VALUE:
        return (_NIL, c) if space or newline else (_VALUE, c)
    return (_NIL, "") if newline else (_COMMENT, "")


def parse(text: str) -> list[tuple[str, str]]:
    """[(command, value)] as Ollama reads `text` (`from` named `model`, a parameter by its
    name); ModelfileError where Ollama would stop."""
    out: list[tuple[str, str]] = []
    state, buf, cmd = _NIL, "", ""
    for c in text:
        nxt, keep = _next(c, state)
        if nxt != state:
            if state == _NAME:
                word = buf.lower()
                if word not in COMMANDS:
                    raise ModelfileError(f"unknown command {buf!r}")
                if word == "parameter":
                    nxt = _PARAM
                else:
                    cmd = "model" if word == "from" else word
            elif state == _PARAM:
                cmd = buf
            elif state == _VALUE:
                value, ok = _unquote(buf.strip(_GO_SPACE))
                if not ok or c in " \t":
                    buf += c
                    continue
                out.append((cmd, value))
            buf, state = "", nxt
        if keep and keep.isprintable():
            buf += keep
    if state == _VALUE:
        value, ok = _unquote(buf.strip(_GO_SPACE))
        if not ok:
            raise ModelfileError("unexpected end of file in a quoted value")
        out.append((cmd, value))
    elif state not in (_NIL, _COMMENT):
        raise ModelfileError("unexpected end of file")
    if not any(name == "model" for name, _ in out):
        raise ModelfileError("no FROM line")
    return out
