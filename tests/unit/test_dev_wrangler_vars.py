"""`edgellm dev`'s reading of wrangler.toml's [vars] (`cli.wrangler_vars`), on the committed file:
the local edge runs with the deployed Worker's settings, except who may call it, which follows the
address it listens on. Through the real CLI process: tests/edge/test_cli.py."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from edgellm.config import Config
from edgellm.vars import check_vars
from edgellm_local.cli import ADDRESS_VARS, wrangler_vars

ROOT = Path(__file__).resolve().parents[2]
# [vars] that describe a Cloudflare binding the local edge does not have (the rate limiter's period,
# the Analytics Engine dataset and its account): read by the Worker's bindings, not by its Config
CLOUDFLARE_ONLY = {"RATE_LIMIT_PERIOD", "ANALYTICS_ACCOUNT_ID", "USAGE_DATASET"}


def args(config: str | None = None, read: bool = True) -> argparse.Namespace:
    return argparse.Namespace(config=config, wrangler_vars=read)


def test_the_committed_wrangler_toml_gives_dev_the_deployed_settings() -> None:
    path = ROOT / "wrangler.toml"
    committed = tomllib.loads(path.read_text())["vars"]
    taken, line = wrangler_vars(args(str(path)))
    assert set(taken) == set(committed) - set(ADDRESS_VARS)
    assert str(path.resolve()) in line and "OPEN_ACCESS follows this edge's address" in line
    config = Config.from_env(taken)
    assert config.run_min_tokens_per_second == float(committed["RUN_MIN_TOKENS_PER_SECOND"]) == 4
    assert (config.model, config.embedding_models) == (committed["MODEL"], (committed["EMBEDDING_MODELS"],))
    assert config.answer_timeout_seconds(256) == 30 + 256 / 4  # the deployed deadline, not the built-in 1 token/s one


def test_no_file_and_the_opt_out_are_built_in_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert wrangler_vars(args()) == ({}, "[vars]: built-in defaults (no wrangler.toml here; --config PATH reads one)")
    (tmp_path / "wrangler.toml").write_text('[vars]\nMODEL = "@cf/x"\n')
    assert wrangler_vars(args())[0] == {"MODEL": "@cf/x"}
    assert wrangler_vars(args(read=False))[0] == {}
    with pytest.raises(ValueError, match="no such file"):
        wrangler_vars(args(str(tmp_path / "other.toml")))


@pytest.mark.parametrize("value", ['"30"', '"ten"', "0"])
def test_a_rate_limit_period_the_binding_cannot_have_is_refused(value: str) -> None:
    """The Rate Limiting binding's period is 10 or 60 s; the Worker's Retry-After is this var, so
    any other value would tell clients a wait the binding does not keep."""
    problems = check_vars(tomllib.loads(f"RATE_LIMIT_PERIOD = {value}\n"))
    assert len(problems) == 1 and "RATE_LIMIT_PERIOD must be the [[ratelimits]] period in seconds: 10 or 60" in problems[0]
    assert check_vars({"RATE_LIMIT_PERIOD": "10"}) == [] and check_vars({"RATE_LIMIT_PERIOD": 60}) == []
