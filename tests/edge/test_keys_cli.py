"""`edgellm keys create|list|revoke|rotate` on a local state directory, as users run it."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

from edgellm.access.keys import KeyRing, parse_api_key
from edgellm_local.emulator.kv import SqliteKV

EDGELLM = Path(sys.executable).with_name("edgellm")


def keys(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EDGELLM), "keys", "--state", str(state), *args], capture_output=True, text=True, timeout=60)


def record(state: Path, key_id: str):
    return asyncio.run(KeyRing(SqliteKV(state / "kv.sqlite3")).get(key_id))


def test_create_list_revoke_rotate(tmp_path: Path) -> None:
    state = tmp_path / "state"
    made = keys(state, "create", "--tenant", "acme", "--rpm", "5", "--share-cache", "--model", "@cf/x")
    assert made.returncode == 0, made.stderr
    api_key = next(line for line in made.stdout.splitlines() if line.startswith("el-"))
    key_id, secret = parse_api_key(api_key)  # type: ignore[misc]
    stored = record(state, key_id)
    assert (stored.tenant, stored.requests_per_minute, stored.share_cache, stored.models) == ("acme", 5, True, ("@cf/x",))
    assert secret not in (state / "kv.sqlite3").read_bytes().decode("latin-1")  # only the hash is stored
    wrangler = next(line for line in made.stdout.splitlines() if "wrangler kv key put" in line)
    assert f"access/keys/{key_id}" in wrangler and secret not in wrangler and stored.secret_sha256 in wrangler

    listed = [json.loads(line) for line in keys(state, "list", "--json").stdout.splitlines()]
    assert [k["key_id"] for k in listed] == [key_id] and "secret_sha256" not in listed[0]

    rotated = keys(state, "rotate", key_id)
    assert rotated.returncode == 0, rotated.stderr
    new_id, _ = parse_api_key(next(line for line in rotated.stdout.splitlines() if line.startswith("el-")))  # type: ignore[misc]
    assert record(state, key_id).revoked is not None and record(state, new_id).tenant == "acme"

    assert keys(state, "revoke", new_id).returncode == 0
    assert record(state, new_id).revoked is not None
    missing = keys(state, "revoke", "nosuchkey000")
    assert missing.returncode == 1 and "no key" in missing.stderr
    bad = keys(state, "create", "--tenant", "_shared")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_state_after_the_action_a_readable_list_and_limits_that_cannot_be_negative(tmp_path: Path) -> None:
    state = tmp_path / "state"
    made = subprocess.run([str(EDGELLM), "keys", "create", "--state", str(state), "--tenant", "acme", "--name", "ci"],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    key_id, _ = parse_api_key(next(line for line in made.stdout.splitlines() if line.startswith("el-")))  # type: ignore[misc]
    assert record(state, key_id).tenant == "acme"  # written under --state given after the action
    table = subprocess.run([str(EDGELLM), "keys", "list", "--state", str(state)], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split()[:3] == ["KEY", "ID", "TENANT"] and row.split()[:3] == [key_id, "acme", "ci"]
    assert re.search(r"\b20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ\b", row), row  # ISO 8601, not epoch seconds
    assert "{" not in table.stdout
    for flag in ("--rpm", "--tpm", "--budget"):
        refused = keys(state, "create", "--tenant", "acme", flag, "-5")
        assert refused.returncode == 2 and "0 (unlimited) or more" in refused.stderr and "Traceback" not in refused.stderr, flag


def test_the_tenant_names_the_edge_uses_itself_are_refused(tmp_path: Path) -> None:
    for tenant in ("default", "Default", "admin", "open"):
        refused = keys(tmp_path / "state", "create", "--tenant", tenant)
        assert refused.returncode == 2 and "reserved" in refused.stderr and "Traceback" not in refused.stderr, tenant


def test_a_key_sets_its_own_semantic_error_bound(tmp_path: Path) -> None:
    made = keys(tmp_path, "create", "--tenant", "acme", "--semantic-cache", "--semantic-max-error", "0.05")
    assert made.returncode == 0, made.stderr
    key_id = made.stdout.split()[2]
    assert record(tmp_path, key_id).semantic_max_error == 0.05
    refused = keys(tmp_path, "create", "--tenant", "acme", "--semantic-max-error", "1.5")
    assert refused.returncode == 2 and "semantic_max_error" in refused.stderr


def test_a_key_made_with_a_guardrails_policy_keeps_it_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    made = keys(state, "create", "--tenant", "acme", "--guardrails", '{"dlp": {"email": "mask"}}')
    assert made.returncode == 0, made.stderr
    listed = [json.loads(line) for line in keys(state, "list", "--json").stdout.splitlines()]
    assert json.loads(listed[0]["guardrails"]) == {"dlp": {"email": "mask"}}
    bad = keys(state, "create", "--tenant", "acme", "--guardrails", '{"dlp": {"e-mail": "mask"}}')
    assert bad.returncode == 2 and "'e-mail'" in bad.stderr and "Traceback" not in bad.stderr
    unmasking = keys(state, "create", "--tenant", "acme", "--guardrails", '{"dlp": {"email": "mask"}, "unmask_answer": true}')
    assert unmasking.returncode == 0, unmasking.stderr
    bad = keys(state, "create", "--tenant", "acme", "--guardrails", '{"dlp": {"email": "mask"}, "unmask_answer": "on"}')
    assert bad.returncode == 2 and "unmask_answer" in bad.stderr and "Traceback" not in bad.stderr
