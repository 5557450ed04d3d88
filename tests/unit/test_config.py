"""Config from `[vars]` strings."""

from __future__ import annotations

import pytest

from edgellm.config import DEFAULT_FALLBACK_MODELS, DEFAULT_MODEL, Config


@pytest.mark.parametrize("env,fallbacks", [
    ({}, DEFAULT_FALLBACK_MODELS),                       # absent: the default list
    ({"FALLBACK_MODELS": ""}, ()),                        # present but empty: fallback off
    ({"FALLBACK_MODELS": "a, b"}, ("a", "b")),
    ({"FALLBACK_MODELS": '["a", "b"]'}, ("a", "b")),
])
def test_fallback_models(env: dict, fallbacks: tuple) -> None:
    assert Config.from_env(env).fallback_models == fallbacks


def test_defaults_and_overrides() -> None:
    assert Config.from_env({}).model == DEFAULT_MODEL
    config = Config.from_env({"MODEL": "@cf/x", "CACHE_CLASSES": '{"hourly": 3600}', "CACHE_DEFAULT_TTL": "120", "ADMIN_TOKEN": ""})
    assert (config.model, config.cache_classes, config.cache_default_ttl, config.admin_token) == ("@cf/x", {"hourly": 3600}, 120, None)
    assert config.models == ("@cf/x", *DEFAULT_FALLBACK_MODELS)


@pytest.mark.parametrize("value", ["0", "-5", "ten", "2.5"])
def test_a_message_cap_below_one_is_refused_at_start_up_naming_the_variable(value: str) -> None:
    """MAX_MESSAGES=0 used to refuse every request ("At most 0 messages"), and a negative cap meant
    nothing; a deploy with one must fail where its owner looks, naming the variable."""
    with pytest.raises(ValueError, match="MAX_MESSAGES"):
        Config.from_env({"MAX_MESSAGES": value})


def test_a_message_cap_of_one_is_kept() -> None:
    assert Config.from_env({"MAX_MESSAGES": "1"}).max_messages == 1
    assert Config.from_env({"MAX_MESSAGES": " 7 "}).max_messages == 7
