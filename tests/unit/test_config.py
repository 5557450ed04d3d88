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


@pytest.mark.parametrize("name", ["START_TIMEOUT_SECONDS", "RUN_MIN_TOKENS_PER_SECOND"])
@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf", "nan"])
def test_a_deadline_or_rate_that_is_not_above_zero_is_refused_at_start_up_naming_the_variable(name: str, value: str) -> None:
    """START_TIMEOUT_SECONDS=0 would refuse every stream and a negative rate means nothing (a
    negative deadline would end every whole answer at once): the deploy fails, naming the variable."""
    with pytest.raises(ValueError, match=name):
        Config.from_env({name: value})


def test_a_whole_answers_deadline_is_the_start_deadline_plus_its_length_at_the_slowest_rate() -> None:
    """The whole-answer deadline grows with max_tokens: a long answer a healthy binding is still
    making is never cut, a stalled one still ends."""
    assert Config().answer_timeout_seconds(256) == 30 + 256 / 1  # the defaults: 30 s, 1 token a second (wrangler.toml sets 4)
    config = Config.from_env({"START_TIMEOUT_SECONDS": "2.5", "RUN_MIN_TOKENS_PER_SECOND": " 10 "})
    assert (config.start_timeout_seconds, config.run_min_tokens_per_second) == (2.5, 10.0)
    assert config.answer_timeout_seconds(100) == 12.5
    assert config.answer_timeout_seconds(1000) > config.answer_timeout_seconds(100)


BGE = "@cf/baai/bge-small-en-v1.5"


@pytest.mark.parametrize(("env", "fragments"), [
    # a chat model that is an embedding model: every chat request would be a 400
    ({"EMBEDDING_MODELS": f"{DEFAULT_MODEL},{BGE}"}, ("MODEL", DEFAULT_MODEL, "EMBEDDING_MODELS", "chat")),
    ({"MODEL": BGE, "EMBEDDING_MODELS": BGE}, ("MODEL", BGE, "EMBEDDING_MODELS")),
    ({"MODEL": BGE}, ("MODEL", BGE, "embedding model")),  # Cloudflare's own list says what it is
    ({"FALLBACK_MODELS": BGE, "EMBEDDING_MODELS": BGE}, ("FALLBACK_MODELS", BGE, "EMBEDDING_MODELS")),
    # every tenant's name and token counts to anyone, while the API itself needs a key
    ({"METRICS_OPEN": "true"}, ("METRICS_OPEN", "OPEN_ACCESS", "admin token")),
    ({"METRICS_OPEN": "true", "OPEN_ACCESS": "false"}, ("METRICS_OPEN", "OPEN_ACCESS")),
], ids=["model-is-listed-embedding", "model-is-embedding-listed", "model-is-known-embedding", "fallback-is-embedding",
        "metrics-open-with-keys-by-default", "metrics-open-with-keys"])
def test_settings_valid_alone_that_together_fail_are_refused_naming_each(env: dict, fragments: tuple) -> None:
    with pytest.raises(ValueError) as info:
        Config.from_env(env)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))
    assert "\n" not in str(info.value)  # one line: the local edge's refusal and the deploy check's are that line


@pytest.mark.parametrize("env", [
    {"EMBEDDING_MODELS": BGE},
    {"METRICS_OPEN": "true", "OPEN_ACCESS": "true"},
    {"METRICS_OPEN": "false", "OPEN_ACCESS": "false"},
    {"MODEL": "@cf/meta/llama-3.1-8b-instruct", "EMBEDDING_MODELS": f"{BGE},@cf/baai/bge-m3"},
], ids=["embeddings-beside-chat", "metrics-open-in-open-mode", "metrics-closed-with-keys", "other-model"])
def test_coherent_settings_are_accepted(env: dict) -> None:
    Config.from_env(env)


@pytest.mark.parametrize(("model", "index", "problem"), [
    (BGE, 384, None),
    ("@cf/baai/bge-base-en-v1.5", 384, "768"),
    ("@cf/baai/bge-m3", 768, "1024"),
    ("@cf/example/unlisted-embedder", 384, None),  # its width is not known before its first answer: nothing to hold it to
])
def test_the_semantic_index_is_held_to_the_embedding_models_width(model: str, index: int, problem: str | None) -> None:
    from edgellm.config import index_width_problem

    said = index_width_problem(Config.from_env({"EMBEDDING_MODELS": model}), index, "the index")
    if problem is None:
        assert said is None
    else:
        assert said is not None and problem in said and str(index) in said and model in said and "EMBEDDING_MODELS" in said
