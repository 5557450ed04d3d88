"""The GUARDRAILS policy: its parse (a bad value is refused by name), the "stricter than"
relation a cached answer is re-checked by, and deploy-check's line for it."""

from __future__ import annotations

import json

import pytest

from edgellm.guardrails.moderation import CATEGORIES
from edgellm.guardrails.policy import NO_POLICY, Policy, PolicyError, at_least_as_strict, parse_policy, stricter_than
from edgellm_local.deploy_check import check_guardrails

EXAMPLE = {
    "moderation": {"prompt": {"S1": "block", "S10": "flag"}, "answer": {"S1": "block"}},
    "dlp": {"secret": "block", "payment_card": "mask", "email": "mask", "phone": "flag", "iban": "mask", "ip_address": "flag"},
}


def test_the_documented_example_parses_into_a_frozen_policy():
    policy = parse_policy(json.dumps(EXAMPLE))
    assert policy.prompt == {"S1": "block", "S10": "flag"}
    assert policy.answer == {"S1": "block"}
    assert policy.dlp["secret"] == "block"
    assert policy.needs_guard and not policy.empty
    assert policy.to_json() == EXAMPLE
    with pytest.raises(TypeError):
        policy.dlp["email"] = "flag"  # type: ignore[index]
    with pytest.raises(AttributeError):
        policy.dlp = {}  # type: ignore[misc]
    assert parse_policy(EXAMPLE) == policy


@pytest.mark.parametrize("value", [None, "", "  ", "{}", {"dlp": {}}])
def test_nothing_is_no_policy(value):
    policy = parse_policy(value)
    assert policy == NO_POLICY and policy.empty and not policy.needs_guard


def test_a_dlp_only_policy_needs_no_guard():
    assert not parse_policy({"dlp": {"email": "mask"}}).needs_guard


def test_the_taxonomy_is_llama_guard_3_s():
    assert list(CATEGORIES) == [f"S{n}" for n in range(1, 15)]
    assert CATEGORIES["S1"] == "Violent Crimes" and CATEGORIES["S14"] == "Code Interpreter Abuse"


@pytest.mark.parametrize("value,named", [
    ('{"moderation": {"prompt": {"S15": "block"}}}', "'S15'"),
    ('{"moderation": {"prompt": {"s1": "block"}}}', "'s1'"),
    ('{"moderation": {"answer": {"S2": "deny"}}}', "'deny'"),
    ('{"moderation": {"answer": {"S2": "mask"}}}', "'mask'"),  # a category has no span to mask
    ('{"moderation": {"output": {}}}', "'output'"),
    ('{"dlp": {"credit_card": "mask"}}', "'credit_card'"),
    ('{"dlp": {"email": "redact"}}', "'redact'"),
    ('{"dlp": {"email": null}}', "None"),
    ('{"dlp": ["email"]}', "['email']"),
    ('{"moderations": {}}', "'moderations'"),
    ('["dlp"]', "['dlp']"),
    ('{"dlp": {"email": "mask"}', "not JSON"),
])
def test_a_bad_value_is_refused_by_name(value, named):
    with pytest.raises(PolicyError) as caught:
        parse_policy(value)
    assert named in str(caught.value)
    assert str(caught.value).startswith("GUARDRAILS")


P = parse_policy
# (a, b, a stricter than b, b stricter than a)
STRICTER = [
    (P({}), P({}), False, False),
    (P({"dlp": {"email": "flag"}}), P({}), True, False),
    (P({"dlp": {"email": "mask"}}), P({"dlp": {"email": "flag"}}), True, False),
    (P({"dlp": {"email": "block"}}), P({"dlp": {"email": "mask"}}), True, False),
    (P({"dlp": {"email": "mask"}}), P({"dlp": {"email": "mask"}}), False, False),
    (P({"moderation": {"answer": {"S1": "block"}}}), P({"moderation": {"answer": {"S1": "flag"}}}), True, False),
    # a prompt rule says nothing about a cached answer's stage, but it is still a stricter policy
    (P({"moderation": {"prompt": {"S1": "block"}}}), P({}), True, False),
    # strict in different places: each asks for something the other does not
    (P({"dlp": {"email": "mask"}}), P({"dlp": {"phone": "mask"}}), True, True),
    (P({"moderation": {"answer": {"S1": "block", "S2": "flag"}}}), P({"moderation": {"answer": {"S1": "flag", "S2": "block"}}}), True, True),
    (P(EXAMPLE), P({"dlp": {"secret": "block"}}), True, False),
]


@pytest.mark.parametrize("a,b,a_over_b,b_over_a", STRICTER)
def test_stricter_than(a, b, a_over_b, b_over_a):
    assert stricter_than(a, b) is a_over_b
    assert stricter_than(b, a) is b_over_a
    assert at_least_as_strict(a, a) and not stricter_than(a, a)
    if not a_over_b:
        assert at_least_as_strict(b, a)


def test_deploy_check_names_the_bad_value():
    (check,) = check_guardrails({"vars": {"GUARDRAILS": '{"dlp": {"emails": "mask"}}'}})
    assert not check.ok and "'emails'" in check.detail and "docs/guardrails.md" in check.fix
    (check,) = check_guardrails({"vars": {"GUARDRAILS": json.dumps(EXAMPLE)}})
    assert check.ok and "9 rule(s)" in check.detail
    assert check_guardrails({"vars": {}}) == []


# --- unmask_answer: the caller's own masked values put back into its answer -----------------------

def test_unmask_answer_is_off_unless_said_and_round_trips():
    assert parse_policy({"dlp": {"email": "mask"}}).unmask_answer is False
    policy = parse_policy(json.dumps({"dlp": {"email": "mask"}, "unmask_answer": True}))
    assert policy.unmask_answer is True
    assert policy.to_json() == {"moderation": {"prompt": {}, "answer": {}}, "dlp": {"email": "mask"}, "unmask_answer": True}
    assert parse_policy(policy.to_json()) == policy
    assert parse_policy({"dlp": {"email": "mask"}, "unmask_answer": False}).to_json() == parse_policy({"dlp": {"email": "mask"}}).to_json()


@pytest.mark.parametrize("value,named", [
    ({"dlp": {"email": "mask"}, "unmask_answer": "true"}, "'true'"),
    ({"dlp": {"email": "mask"}, "unmask_answer": 1}, "1"),
    ({"dlp": {"email": "mask"}, "unmask_answer": None}, "None"),
    ({"dlp": {"email": "block"}, "unmask_answer": True}, "no dlp detector is 'mask'"),
    ({"unmask_answer": True}, "no dlp detector is 'mask'"),
    ({"dlp": {"email": "mask"}, "unmask_answers": True}, "'unmask_answers'"),
])
def test_a_bad_unmask_answer_is_refused_by_name(value, named):
    with pytest.raises(PolicyError) as caught:
        parse_policy(json.dumps(value))
    assert named in str(caught.value) and str(caught.value).startswith("GUARDRAILS")


def test_unmask_answer_asks_nothing_more_of_a_cached_answer():
    """The cache holds the masked answer whatever the caller's unmasking: it is no stricter."""
    on, off = P({"dlp": {"email": "mask"}, "unmask_answer": True}), P({"dlp": {"email": "mask"}})
    assert not stricter_than(on, off) and not stricter_than(off, on)


def test_deploy_check_refuses_an_ill_typed_unmask_answer():
    (check,) = check_guardrails({"vars": {"GUARDRAILS": '{"dlp": {"email": "mask"}, "unmask_answer": "yes"}'}})
    assert not check.ok and "unmask_answer" in check.detail
    (check,) = check_guardrails({"vars": {"GUARDRAILS": '{"dlp": {"email": "mask"}, "unmask_answer": true}'}})
    assert check.ok
