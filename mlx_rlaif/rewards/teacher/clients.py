"""Thin async wrappers over the official `anthropic` and `openai` SDKs: one call, one `Answer`.

Covered:
- Anthropic Messages API; structured output by a forced tool call (`tool_choice`), the answer
  is the tool's `input`; `stop_reason == "refusal"` is a refusal;
- OpenAI Chat Completions and any OpenAI-compatible server through `base_url` (mlx_lm.server,
  vLLM, Ollama, LM Studio); structured output by `response_format` json_schema (strict); a
  `message.refusal` or `finish_reason == "content_filter"` is a refusal;
- the SDKs' own `max_retries` (429 with retry-after, 408/409, 5xx, timeouts) and `timeout`;
  nothing here retries on its own;
- errors mapped to two kinds: `TeacherError` (401/403/404: the run must stop; the message names
  the key's environment variable, never the key or the server's error text, which can quote
  part of the key) and `CallError` (anything else after the SDK's retries: the completion is
  unscorable).

Not covered: streaming, batch APIs, prompt caching, token counting before a call.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...errors import ConfigError, TeacherError

_FATAL = {401: "was refused (401 unauthorized)", 403: "was refused (403 forbidden)",
          404: "was not found (404)"}


class CallError(Exception):
    """A teacher call failed after the SDK's retries; the completion is unscorable."""


@dataclass(frozen=True)
class Answer:
    """What the teacher said: `data` is the tool input (dict) or the text; `refusal` is non-empty
    when the model refused."""

    data: Any
    input_tokens: int = 0
    output_tokens: int = 0
    refusal: str = ""


@dataclass(frozen=True)
class Endpoint:
    provider: str  # "anthropic" | "openai"
    model: str
    api_key: str
    key_env: str
    base_url: str = ""
    timeout_s: float = 60.0
    max_retries: int = 3
    max_tokens: int = 512
    temperature: float | None = 0.0
    structured: bool = True

    def __repr__(self) -> str:  # never show the key
        return f"Endpoint({self.provider}, {self.model}, {self.base_url or 'default url'})"


class Client(Protocol):
    by_tool: bool  # True: structured answers come as a tool call (prompts say so)

    async def ask(self, system: str, user: str, schema: dict | None, name: str) -> Answer: ...

    async def close(self) -> None: ...


def import_sdk(provider: str) -> Any:
    """The SDK module, or a ConfigError naming the pip package."""
    try:
        return importlib.import_module(provider)
    except ImportError:
        raise ConfigError(f"reward.teacher.provider = {provider} needs the `{provider}` package: "
                          f"pip install {provider}") from None


def make_client(ep: Endpoint) -> Client:
    sdk = import_sdk(ep.provider)
    return AnthropicClient(ep, sdk) if ep.provider == "anthropic" else OpenAIClient(ep, sdk)


async def _guarded(ep: Endpoint, sdk: Any, coro: Any) -> Any:
    """Await an SDK call, mapping its errors to TeacherError / CallError."""
    try:
        return await coro
    except sdk.APIStatusError as e:
        status = e.status_code
        if status in _FATAL:
            where = ep.base_url or f"the {ep.provider} API"
            raise TeacherError(
                f"teacher request to {where} for model {ep.model!r} {_FATAL[status]}: check the "
                f"key in ${ep.key_env} and reward.teacher.model/base_url") from None
        retried = status in (408, 409, 429) or status >= 500  # the SDK retries only these
        raise CallError(f"HTTP {status}" + (f" after {ep.max_retries} retries" if retried else "")
                        ) from None
    except sdk.APITimeoutError:
        raise CallError(f"timed out ({ep.timeout_s:g} s, {ep.max_retries} retries)") from None
    except sdk.APIConnectionError:
        raise CallError(f"connection failed after {ep.max_retries} retries") from None
    except (sdk.APIError, json.JSONDecodeError) as e:  # a body that is not the API's JSON
        raise CallError(f"invalid response ({type(e).__name__})") from None


def _read(reader: Callable[..., Answer], resp: Any, *args: Any) -> Answer:
    """Apply `reader`; a response of the wrong shape (servers that only look compatible) is a
    CallError, not a crash."""
    try:
        return reader(resp, *args)
    except (AttributeError, TypeError, IndexError, KeyError) as e:
        raise CallError(f"invalid response shape ({type(e).__name__})") from None


def _count(n: Any) -> int:
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0


def _read_message(msg: Any, tool: str) -> Answer:
    """An Anthropic Message -> Answer: the named tool call's input, else the text."""
    usage = msg.usage
    tokens = (_count(getattr(usage, "input_tokens", 0)),
              _count(getattr(usage, "output_tokens", 0)))
    text = "".join(b.text for b in msg.content if b.type == "text")
    if msg.stop_reason == "refusal":
        return Answer(None, *tokens, refusal=text or "refused")
    calls = [b.input for b in msg.content if b.type == "tool_use" and b.name == tool]
    return Answer(calls[0] if tool and calls else text, *tokens)  # no call: the parser rejects


def _read_completion(resp: Any) -> Answer:
    """An OpenAI ChatCompletion -> Answer: the first choice's content."""
    usage = resp.usage
    tokens = (_count(getattr(usage, "prompt_tokens", 0)),
              _count(getattr(usage, "completion_tokens", 0)))
    choice = resp.choices[0]
    msg = choice.message
    if msg.refusal or choice.finish_reason == "content_filter":
        return Answer(None, *tokens, refusal=msg.refusal or "content filtered")
    return Answer(msg.content or "", *tokens)


class AnthropicClient:
    def __init__(self, ep: Endpoint, sdk: Any) -> None:
        self.ep, self.sdk = ep, sdk
        self.by_tool = ep.structured
        self._api = sdk.AsyncAnthropic(api_key=ep.api_key, base_url=ep.base_url or None,
                                       timeout=ep.timeout_s, max_retries=ep.max_retries)

    async def ask(self, system: str, user: str, schema: dict | None, name: str) -> Answer:
        kw: dict[str, Any] = {"model": self.ep.model, "max_tokens": self.ep.max_tokens,
                              "system": system, "messages": [{"role": "user", "content": user}]}
        # This SDK's messages.create has no sampling parameters: the model's default applies.
        tool = schema is not None and self.ep.structured
        if tool:
            kw["tools"] = [{"name": name, "description": "Submit the grades.",
                            "input_schema": schema}]
            kw["tool_choice"] = {"type": "tool", "name": name}
        msg = await _guarded(self.ep, self.sdk, self._api.messages.create(**kw))
        return _read(_read_message, msg, name if tool else "")

    async def close(self) -> None:
        await self._api.close()


class OpenAIClient:
    by_tool = False

    def __init__(self, ep: Endpoint, sdk: Any) -> None:
        self.ep, self.sdk = ep, sdk
        kw: dict[str, Any] = {"api_key": ep.api_key, "timeout": ep.timeout_s,
                              "max_retries": ep.max_retries}
        if ep.base_url:
            kw["base_url"] = ep.base_url
        self._api = sdk.AsyncOpenAI(**kw)

    async def ask(self, system: str, user: str, schema: dict | None, name: str) -> Answer:
        kw: dict[str, Any] = {"model": self.ep.model,
                              "messages": [{"role": "system", "content": system},
                                           {"role": "user", "content": user}]}
        # OpenAI's own API wants max_completion_tokens; compatible servers know max_tokens.
        kw["max_tokens" if self.ep.base_url else "max_completion_tokens"] = self.ep.max_tokens
        if self.ep.temperature is not None:
            kw["temperature"] = self.ep.temperature
        if schema is not None and self.ep.structured:
            spec = {"name": name, "schema": schema, "strict": True}
            kw["response_format"] = {"type": "json_schema", "json_schema": spec}
        resp = await _guarded(self.ep, self.sdk, self._api.chat.completions.create(**kw))
        return _read(_read_completion, resp)

    async def close(self) -> None:
        await self._api.close()
