"""The request's cache controls, table-driven."""

from __future__ import annotations

import pytest

from edgellm.cache.policy import cache_policy
from edgellm.config import Config
from edgellm.errors import GatewayError
from edgellm.http import Request
from edgellm.openai import parse_chat_request

CONFIG = Config(cache_default_ttl=3600, cache_classes={"news": 300, "faq": 86400, "template": 604800})
MESSAGES = [{"role": "user", "content": "hi"}]


def policy(body: dict, **headers: str):
    request = Request("POST", "http://edge/v1/chat/completions", {k.replace("_", "-"): v for k, v in headers.items()})
    return cache_policy(request, parse_chat_request({"messages": MESSAGES, **body}, CONFIG), CONFIG)


@pytest.mark.parametrize("body,cached", [
    ({"temperature": 0}, True),
    ({"temperature": 0.0}, True),
    ({}, False),                                # Workers AI defaults to 0.6: not deterministic
    ({"temperature": 0.6}, False),
    ({"temperature": 0.7, "seed": 42}, True),   # an explicit seed is deterministic
    ({"seed": 1}, True),
])
def test_only_deterministic_requests_are_cached(body: dict, cached: bool) -> None:
    p = policy(body)
    assert (not p.bypass) == cached
    assert p.read == cached and p.write == cached


@pytest.mark.parametrize("headers,read,write,bypass", [
    ({}, True, True, False),
    ({"cache_control": "no-cache"}, False, True, False),
    ({"cache_control": "no-store"}, True, False, False),
    ({"cache_control": "no-cache, no-store"}, False, False, False),
    ({"cf_aig_skip_cache": "true"}, False, False, True),
    ({"cf_aig_skip_cache": "TRUE"}, False, False, True),
    ({"cf_aig_skip_cache": "false"}, True, True, False),
])
def test_request_controls(headers: dict, read: bool, write: bool, bypass: bool) -> None:
    p = policy({"temperature": 0}, **headers)
    assert (p.read, p.write, p.bypass) == (read, write, bypass)


@pytest.mark.parametrize("headers,ttl", [
    ({}, 3600),
    ({"cf_aig_cache_ttl": "120"}, 120),
    ({"cf_aig_cache_ttl": "5"}, 60),                       # clamped to KV's floor
    ({"cf_aig_cache_ttl": "99999999"}, 30 * 86400),        # clamped to 30 days
    ({"x_edgellm_cache_class": "news"}, 300),
    ({"x_edgellm_cache_class": "template"}, 604800),
    ({"x_edgellm_cache_class": "news", "cf_aig_cache_ttl": "900"}, 900),  # explicit TTL wins
])
def test_ttl(headers: dict, ttl: int) -> None:
    assert policy({"temperature": 0}, **headers).ttl == ttl


@pytest.mark.parametrize("headers,param", [
    ({"cf_aig_cache_ttl": "soon"}, "cf-aig-cache-ttl"),
    ({"x_edgellm_cache_class": "weekly"}, "x-edgellm-cache-class"),
    ({"cf_aig_cache_key": "k" * 300}, "cf-aig-cache-key"),
])
def test_bad_controls_are_400(headers: dict, param: str) -> None:
    with pytest.raises(GatewayError) as info:
        policy({"temperature": 0}, **headers)
    assert info.value.status == 400 and info.value.param == param


def test_custom_key_is_carried() -> None:
    assert policy({"temperature": 0}, cf_aig_cache_key="faq:hours").custom_key == "faq:hours"


@pytest.mark.parametrize("body", [{"temperature": 0}, {}, {"temperature": 0.7, "seed": 42}])
@pytest.mark.parametrize("default_ttl", [3600, 5, 99999999])
def test_a_request_without_cache_headers_gets_what_reading_them_gives(body: dict, default_ttl: int) -> None:
    """Most requests send none of the policy's headers: they get the config's policy made once
    (no header read), the same policy reading them would give (an empty Cache-Control is read)."""
    config = Config(cache_default_ttl=default_ttl)

    def with_headers(**headers: str):
        request = Request("POST", "http://edge/v1/chat/completions", {k.replace("_", "-"): v for k, v in headers.items()})
        return cache_policy(request, parse_chat_request({"messages": MESSAGES, **body}, config), config)

    assert with_headers(x_unrelated="1") == with_headers(cache_control="")
    assert with_headers().ttl == min(max(default_ttl, 60), 30 * 86400)
