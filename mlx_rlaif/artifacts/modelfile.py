"""An Ollama Modelfile next to an exported GGUF: `ollama create NAME -f Modelfile`.

The chat template is written in Ollama's template language (Go's text/template over `.System`
and `.Messages`) for the two chat formats of the architectures GGUF export takes: ChatML
(Qwen2/2.5, Qwen3: `<|im_start|>role ... <|im_end|>`) and Llama 3's header format. Which one is
read from the tokenizer's own (Jinja) chat template; the system turn the tokenizer's template adds
when a conversation has none (Qwen2.5's "You are Qwen, ...") is found by rendering that template
once and kept, so both render the same prompt text (tests/test_gguf.py renders a few
conversations both ways). The run's system prompt (`model.system_prompt`) becomes `SYSTEM`, the
tokenizer's end-of-sequence tokens the `stop` parameters.

Every value is written so that Ollama's Modelfile parser (ollama/ollama parser/parser.go,
`ParseFile`) reads back exactly that value, or it is refused in one line. That parser unescapes
nothing: a value ends at the first line end where the text so far is a whole `"..."` or
`\"\"\"...\"\"\"` string (or unquoted), and it drops characters that are not printable. So
`quoted` writes a stop as `"v"` when it is one line (and does not start with `""`: read as a
triple quote), a template or system prompt as `\"\"\"v\"\"\"` when `\"\"\"` is not in it,
each the other way where only that one reads back; it refuses a value neither form carries or
holding a character the parser would drop (control characters, bidirectional overrides; newline and
tab excepted). The tokenizer's own text (its end-of-sequence tokens, the default system turn)
is input like a downloaded file's: an end-of-sequence token `x"` + newline + `ADAPTER ...`
cannot add a line (tests/test_gguf.py reads the file back with tests/ollama_modelfile.py, a
reading of that grammar). The default system turn goes into the template, whose language reads
`{{`: one holding `{{` is refused. `check_name` keeps `--name` (the GGUF's file name and the
`FROM` line) to letters, digits, `.`, `_` and `-`.

Not covered: tools and tool calls, Qwen3's thinking switch and the stripping of earlier
`<think>` blocks, Llama 3.1's date lines in the system turn, other chat formats (refused in one
line).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UsageError
from ..terminal import visible

CHATML_MARK, LLAMA3_MARK = "<|im_start|>", "<|start_header_id|>"
PROBE_USER = "mlx-rlaif-probe-user"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class ChatFormat:
    """A chat format: its family and the system text used when a conversation has none."""

    family: str  # "chatml" or "llama3"
    default_system: str | None


def chat_format(chat_template: str | None, render_user_only: str | None) -> ChatFormat:
    """The family of a tokenizer's chat template, and its default system turn, from the
    template text and its rendering of a conversation of one user message (PROBE_USER)."""
    if not chat_template:
        raise UsageError("the tokenizer has no chat template: Ollama needs one; export from a "
                         "chat (instruct) model")
    if CHATML_MARK in chat_template:
        family, head = "chatml", "<|im_start|>system\n"
        end = "<|im_end|>"
    elif LLAMA3_MARK in chat_template:
        family, head = "llama3", "<|start_header_id|>system<|end_header_id|>\n\n"
        end = "<|eot_id|>"
    else:
        raise UsageError("the chat template is neither ChatML (Qwen) nor Llama 3's: the "
                         "Modelfile can only be written for those")
    default = None
    text = render_user_only or ""
    if head in text and text.index(head) < text.find(PROBE_USER):
        start = text.index(head) + len(head)
        default = text[start:text.index(end, start)]
    return ChatFormat(family, default)


def check_name(name: str) -> str:
    """`name` when it may name the GGUF file and the model (NAME), else UsageError."""
    if not NAME.fullmatch(name):
        raise UsageError(f"--name '{visible(name, lines=False)}': use 1-64 letters, digits, "
                         "'.', '_' or '-', starting with a letter or digit (it names the GGUF "
                         "file in --out and the model)")
    return name


def default_name(base: str) -> str:
    """A NAME from the base model's path or repository (its last part, other characters as
    '-'), 'model' where nothing is left."""
    last = base.rstrip("/").replace("builtin:", "").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", last).lstrip("._-")[:64].rstrip("-")
    return name or "model"


def _system_block(head: str, end: str, default: str | None) -> str:
    fallback = f"{{{{ else }}}}{head}{default}{end}" if default is not None else ""
    return f"{{{{- if .System }}}}{head}{{{{ .System }}}}{end}{fallback}{{{{ end }}}}"


def go_template(fmt: ChatFormat) -> str:
    """The chat template in Ollama's template language."""
    if fmt.family == "chatml":
        system = _system_block("<|im_start|>system\n", "<|im_end|>\n", fmt.default_system)
        return (system + '{{- range .Messages }}{{ if ne .Role "system" }}<|im_start|>'
                "{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}{{ end }}"
                "<|im_start|>assistant\n")
    head = "<|start_header_id|>system<|end_header_id|>\n\n"
    system = _system_block(head, "<|eot_id|>", fmt.default_system)
    return ("<|begin_of_text|>" + system + '{{- range .Messages }}{{ if ne .Role "system" }}'
            "<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>"
            "{{ end }}{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n")


def quoted(value: str, what: str, *, block: bool = False) -> str:
    """`value` as one Modelfile argument Ollama's parser reads back unchanged (the module's
    docstring), or UsageError naming `what`: `"v"` (one line, not starting with `""`) or
    `\"\"\"v\"\"\"` (no `\"\"\"` inside), the second first where `block` (a template, a system
    prompt: text a user may edit)."""
    dropped = next((c for c in value if not (c.isprintable() or c in "\n\t")), None)
    if dropped is not None:
        raise UsageError(f"{what} holds {visible(dropped, lines=False)}, which Ollama's "
                         "Modelfile parser would drop: the Modelfile is not written")
    one_line = "\n" not in value and not f'"{value}"'.startswith('"""')
    triple = '"""' not in value
    if one_line and not (block and triple):
        return f'"{value}"'
    if triple:
        return f'"""{value}"""'
    raise UsageError(f'{what} holds """ and more than one line (or starts with ""), which a '
                     "Modelfile cannot quote: the Modelfile is not written")


def _checked_default(fmt: ChatFormat) -> ChatFormat:
    if fmt.default_system is not None and "{{" in fmt.default_system:
        raise UsageError("the tokenizer's default system turn holds '{{', which Ollama's "
                         "template language would read as an action: the Modelfile is not "
                         "written")
    return fmt


def modelfile(gguf_name: str, fmt: ChatFormat, stops: Sequence[str],
              system_prompt: str | None) -> str:
    """The Modelfile text: FROM the GGUF beside it, TEMPLATE, stop tokens, SYSTEM."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*\.gguf", gguf_name):
        raise UsageError(f"'{visible(gguf_name, lines=False)}' cannot name the GGUF in a "
                         "Modelfile: use letters, digits, '.', '_' and '-'")
    template = go_template(_checked_default(fmt))
    lines = [f"FROM ./{gguf_name}", f"TEMPLATE {quoted(template, 'the chat template', block=True)}"]
    for s in dict.fromkeys(stops):
        what = f"the tokenizer's end-of-sequence token '{visible(s[:40], lines=False)}'"
        if not s:
            raise UsageError("the tokenizer has an empty end-of-sequence token: no stop to write")
        lines.append(f"PARAMETER stop {quoted(s, what)}")
    if system_prompt:
        lines.append(f"SYSTEM {quoted(system_prompt, 'the system prompt', block=True)}")
    return "\n".join(lines) + "\n"
