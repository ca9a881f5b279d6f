"""An Ollama Modelfile next to an exported GGUF: `ollama create NAME -f Modelfile`.

The chat template is written in Ollama's template language (Go's text/template over `.System`
and `.Messages`) for the two chat formats of the architectures GGUF export takes: ChatML
(Qwen2/2.5, Qwen3: `<|im_start|>role ... <|im_end|>`) and Llama 3's header format. Which one is
read from the tokenizer's own (Jinja) chat template; the system turn the tokenizer's template adds
when a conversation has none (Qwen2.5's "You are Qwen, ...") is found by rendering that template
once and kept, so both render the same prompt text (tests/test_gguf.py renders a few
conversations both ways). The run's system prompt (`model.system_prompt`) becomes `SYSTEM`, the
tokenizer's end-of-sequence tokens the `stop` parameters.

Not covered: tools and tool calls, Qwen3's thinking switch and the stripping of earlier
`<think>` blocks, Llama 3.1's date lines in the system turn, other chat formats (refused in one
line).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UsageError

CHATML_MARK, LLAMA3_MARK = "<|im_start|>", "<|start_header_id|>"
PROBE_USER = "mlx-rlaif-probe-user"


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


def _quoted(text: str) -> str:
    if '"""' in text:
        raise UsageError('the system prompt contains """, which a Modelfile cannot quote: '
                         "change model.system_prompt")
    return f'"""{text}"""'


def modelfile(gguf_name: str, fmt: ChatFormat, stops: Sequence[str],
              system_prompt: str | None) -> str:
    """The Modelfile text: FROM the GGUF beside it, TEMPLATE, stop tokens, SYSTEM."""
    lines = [f"FROM ./{gguf_name}", f"TEMPLATE {_quoted(go_template(fmt))}"]
    lines += [f'PARAMETER stop "{s}"' for s in dict.fromkeys(stops)]
    if system_prompt:
        lines.append(f"SYSTEM {_quoted(system_prompt)}")
    return "\n".join(lines) + "\n"
