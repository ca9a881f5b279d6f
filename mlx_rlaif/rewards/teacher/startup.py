"""Start-up checks of a teacher, before any model loads: provider, model, URL, prices, rubric,
SDK and key, each a one-line ConfigError naming the key and the fix.

The key comes from the environment variable the config names (default ANTHROPIC_API_KEY /
OPENAI_API_KEY). With `base_url` set and that variable unset, the placeholder key "not-needed" is
sent (local servers such as mlx_lm.server, vLLM, Ollama ignore it; a server that does check it
answers 401, which stops the run). Not covered: checking the key against the API (the first
call does that).
"""

from __future__ import annotations

import logging
import os

from ...config import TeacherConfig
from ...errors import ConfigError
from . import judge
from .clients import Endpoint, import_sdk

log = logging.getLogger(__name__)

DEFAULT_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
NO_KEY = "not-needed"


# --- start-up checks -------------------------------------------------------------------------


def key_env(cfg: TeacherConfig) -> str:
    return cfg.api_key_env or DEFAULT_KEY_ENV.get(cfg.provider, "")


def check_teacher(cfg: TeacherConfig) -> tuple[Endpoint, judge.Rubric]:
    """Every start-up check, before any model loads; returns the endpoint and rubric."""
    if cfg.provider not in DEFAULT_KEY_ENV:
        raise ConfigError("reward.teacher.provider is none: set it to anthropic or openai")
    if not cfg.model.strip():
        raise ConfigError("reward.teacher.model is empty: name the teacher model (e.g. "
                          "claude-3-5-haiku-latest, gpt-4o-mini, or what a local server serves)")
    if cfg.base_url and not cfg.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"reward.teacher.base_url = {cfg.base_url!r} must start with http:// "
                          "or https://")
    if cfg.max_cost_usd > 0 and cfg.price_in_per_mtok == 0 and cfg.price_out_per_mtok == 0:
        raise ConfigError("reward.teacher.max_cost_usd needs prices to estimate cost: set "
                          "reward.teacher.price_in_per_mtok and price_out_per_mtok")
    rubric = judge.rubric_from_config(cfg.criteria)
    judge.views(rubric, cfg.strip_comments)  # strip_comments needs a correctness criterion
    if cfg.samples > 1 and cfg.provider == "openai" and cfg.temperature == 0:
        log.warning("reward.teacher.samples = %d at temperature 0: the judgements will be "
                    "(nearly) the same; raise reward.teacher.temperature", cfg.samples)
    import_sdk(cfg.provider)
    env = key_env(cfg)
    key = os.environ.get(env, "")
    if not key and not cfg.base_url:
        raise ConfigError(f"the {cfg.provider} teacher needs an API key in ${env}: export it, or "
                          "set reward.teacher.api_key_env to the variable that holds it")
    ep = Endpoint(cfg.provider, cfg.model, key or NO_KEY, env, cfg.base_url.rstrip("/"),
                  cfg.timeout_s, cfg.max_retries, cfg.max_tokens, cfg.temperature,
                  cfg.structured_output)
    return ep, rubric
