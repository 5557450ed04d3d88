"""Where the guardrails policy comes from: `GUARDRAILS`, `GUARD_FAIL` and `GUARD_MODEL` in
`[vars]`, a key's own policy (`edgellm keys create --guardrails`), and the start-up refusal of a
policy that moderates with no guard behind it (the local edge's `--guard-model`)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgellm.access.keys import KeyRecord, new_key
from edgellm.config import DEFAULT_GUARD_MODEL, Config
from edgellm.guardrails.policy import NO_POLICY
from edgellm.vars import check_vars

POLICY = {"moderation": {"prompt": {"S1": "block"}}, "dlp": {"email": "mask"}}


def test_guardrails_vars_are_read_into_the_config() -> None:
    config = Config.from_env({"GUARDRAILS": json.dumps(POLICY), "GUARD_FAIL": "open", "GUARD_MODEL": "@cf/x/guard"})
    assert config.guardrails.prompt == {"S1": "block"} and config.guardrails.dlp == {"email": "mask"}
    assert config.guard_fail == "open" and config.guard_model == "@cf/x/guard"
    default = Config.from_env({})
    assert default.guardrails is NO_POLICY and default.guard_fail == "closed" and default.guard_model == DEFAULT_GUARD_MODEL


@pytest.mark.parametrize("name,value,named", [
    ("GUARDRAILS", '{"moderation": {"prompt": {"S15": "block"}}}', "'S15'"),
    ("GUARDRAILS", '{"dlp": {"email": "deny"}}', "'deny'"),
    ("GUARDRAILS", "{not json", "not JSON"),
    ("GUARD_FAIL", "sometimes", "'sometimes'"),
    ("GUARDRAILS", '{"dlp": {"email": "mask"}, "unmask_answer": "yes"}', "'yes'"),
    ("GUARDRAILS", '{"dlp": {"email": "flag"}, "unmask_answer": true}', "no dlp detector is 'mask'"),
])
def test_a_bad_guardrails_var_is_refused_by_name(name: str, value: str, named: str) -> None:
    with pytest.raises(ValueError) as refused:
        Config.from_env({name: value})
    assert name in str(refused.value) and named in str(refused.value)
    assert any(named in line for line in check_vars({name: value}))  # deploy-check and `dev --var` say the same


def test_a_key_carries_its_own_policy_and_a_bad_one_is_refused() -> None:
    made = new_key("acme", 0.0, guardrails=json.dumps(POLICY))
    again = KeyRecord.decode(made.record.encode())
    assert again.policy is not None and again.policy.prompt == {"S1": "block"}
    assert new_key("acme", 0.0).record.policy is None  # none: the gateway's applies
    with pytest.raises(ValueError, match="'S99'"):
        new_key("acme", 0.0, guardrails='{"moderation": {"answer": {"S99": "flag"}}}')
    unmasking = new_key("acme", 0.0, guardrails='{"dlp": {"email": "mask"}, "unmask_answer": true}')
    assert KeyRecord.decode(unmasking.record.encode()).policy.unmask_answer is True  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="unmask_answer"):
        new_key("acme", 0.0, guardrails='{"dlp": {"email": "mask"}, "unmask_answer": 1}')


def test_a_policy_that_moderates_without_a_guard_model_is_refused_at_start(tmp_path: Path) -> None:
    from edgellm_local.edge import EdgeSettings, build_deps

    config = Config(guardrails=Config.from_env({"GUARDRAILS": json.dumps(POLICY)}).guardrails)
    with pytest.raises(ValueError, match="--guard-model"):
        build_deps(EdgeSettings(model_path=tmp_path / "never-read.gguf", state_dir=tmp_path, config=config))
