"""`edgellm keys create|list|revoke|rotate`: API keys in the local edge's KV (`.state/kv.sqlite3`).

Each change also prints the `wrangler kv key put` command that writes the same record to the
Worker's real namespace (the `CACHE` binding), so a key made here can be deployed as is.

A revoked or rotated key keeps working wherever an edge has its record cached (up to 30 s: the
key cache, `edgellm.access.keys.KeyCache`); `revoke --now` also asks a running edge's admin route
to drop it from its cache, so that edge refuses it at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgellm.access.keys import KeyRecord, KeyRing, new_key, rotated
from edgellm.guardrails.policy import parse_policy

from edgellm_local.cli_args import COUNT
from edgellm_local.emulator.kv import SqliteKV


def wrangler_put(record: KeyRecord, binding: str = "CACHE") -> str:
    return (f"npx wrangler kv key put --binding {binding} --remote {shlex.quote(record.kv_key)} "
            f"{shlex.quote(record.encode().decode())} --metadata {shlex.quote(json.dumps({'tenant': record.tenant}))}")


def _ring(args: argparse.Namespace) -> KeyRing:
    return KeyRing(SqliteKV(Path(args.state) / "kv.sqlite3"))


async def _create(args: argparse.Namespace) -> int:
    try:
        made = new_key(args.tenant, time.time(), requests_per_minute=args.rpm, tokens_per_minute=args.tpm,
                       token_budget=args.budget, models=tuple(args.model or ()), share_cache=args.share_cache,
                       semantic_cache=args.semantic_cache, semantic_max_error=args.semantic_max_error, guardrails=_policy_text(args.guardrails), name=args.name or "")
    except ValueError as exc:
        print(f"edgellm: error: {exc}", file=sys.stderr)
        return 2
    await _ring(args).put(made.record)
    print(f"key id {made.record.key_id} for tenant {made.record.tenant} (shown once; only its hash is stored):")
    print(made.api_key)
    print(f"on Cloudflare: {wrangler_put(made.record)}")
    return 0


def _policy_text(value: str | None) -> str:
    """The policy as compact JSON, checked (a bad one is the parser's ValueError, naming it)."""
    if not value:
        return ""
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise ValueError(f"--guardrails is not JSON: {exc}") from None
    parse_policy(parsed)
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"))


def _iso(t: float | None) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if t else "-"


def _limit(n: int) -> str:
    return str(n) if n > 0 else "-"


def key_table(records: list[KeyRecord]) -> str:
    """`keys list` for a person: one row per key, times in ISO 8601 UTC, `-` for none/unlimited."""
    head = ("KEY ID", "TENANT", "NAME", "RPM", "TPM", "BUDGET", "MODELS", "SHARED", "CREATED", "REVOKED")
    rows = [head] + [(r.key_id, r.tenant, r.name or "-", _limit(r.requests_per_minute), _limit(r.tokens_per_minute),
                      _limit(r.token_budget), ",".join(r.models) or "all", "yes" if r.share_cache else "no",
                      _iso(r.created), _iso(r.revoked)) for r in sorted(records, key=lambda r: r.created)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


async def _list(args: argparse.Namespace) -> int:
    records = await _ring(args).list()
    if args.json:
        for record in records:
            print(json.dumps(record.public_json(), sort_keys=True))
    elif records:
        print(key_table(records))
    else:
        print("no keys yet: edgellm keys create --tenant NAME")
    return 0


async def _find(ring: KeyRing, key_id: str) -> KeyRecord | None:
    record = await ring.get(key_id)
    if record is None:
        print(f"edgellm: error: no key {key_id!r}", file=sys.stderr)
    return record


async def _revoke(args: argparse.Namespace) -> int:
    ring = _ring(args)
    record = await _find(ring, args.key_id)
    if record is None:
        return 1
    revoked = replace(record, revoked=time.time())
    await ring.put(revoked)
    print(f"revoked {record.key_id}; an edge that has the key cached accepts it for up to 30 s more"
          + ("" if args.now else " (--now drops it from a running edge's cache)"))
    print(f"on Cloudflare: {wrangler_put(revoked)}")
    if args.now:
        return _drop_from_edge(args, record.key_id)
    return 0


def _drop_from_edge(args: argparse.Namespace, key_id: str) -> int:
    """`POST /admin/keys/{id}/revoke` on a running edge: it drops the key from its cache now."""
    token = args.admin_token or os.environ.get("EDGELLM_ADMIN_TOKEN")
    if not token:
        print("edgellm: error: --now needs the edge's admin token (--admin-token or $EDGELLM_ADMIN_TOKEN)", file=sys.stderr)
        return 2
    request = urllib.request.Request(f"{args.edge.rstrip('/')}/admin/keys/{key_id}/revoke", data=b"{}", method="POST",
                                     headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer: dict[str, Any] = json.loads(response.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        print(f"edgellm: error: the edge at {args.edge} did not drop the key ({reason}); it refuses it within 30 s", file=sys.stderr)
        return 1
    print(f"the edge at {args.edge} refuses {key_id} now ({answer.get('dropped', 'dropped')})")
    return 0


async def _rotate(args: argparse.Namespace) -> int:
    ring = _ring(args)
    record = await _find(ring, args.key_id)
    if record is None:
        return 1
    try:
        old, made = rotated(record, time.time())
    except ValueError as exc:
        print(f"edgellm: error: {exc}", file=sys.stderr)
        return 2
    await ring.put(made.record)
    await ring.put(old)
    print(f"revoked {old.key_id} (an edge that has it cached accepts it for up to 30 s more); "
          f"new key id {made.record.key_id} for tenant {made.record.tenant}:")
    print(made.api_key)
    print(f"on Cloudflare: {wrangler_put(made.record)}")
    print(f"on Cloudflare: {wrangler_put(old)}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    keys = sub.add_parser("keys", help="manage API keys (local KV; prints the wrangler command for Cloudflare)")
    keys.add_argument("--state", default=".state", help="the local edge's state directory")
    actions = keys.add_subparsers(dest="action", required=True)
    # --state is accepted after the action too (`keys create --state X`); SUPPRESS keeps the one given before
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--state", default=argparse.SUPPRESS, help="the local edge's state directory (default: .state)")
    create = actions.add_parser("create", help="make a key for a tenant", parents=[state])
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", help="a label")
    create.add_argument("--rpm", type=COUNT, default=60, help="requests per minute (0: unlimited)")
    create.add_argument("--tpm", type=COUNT, default=0, help="tokens per minute (0: unlimited)")
    create.add_argument("--budget", type=COUNT, default=0, help="lifetime token budget (0: none)")
    create.add_argument("--model", action="append", help="a model the key may use (repeat; default: all)")
    create.add_argument("--share-cache", action="store_true", help="share cache entries with other tenants that share")
    create.add_argument("--semantic-cache", action="store_true",
                        help="answer this key's paraphrases from the cache (docs/embeddings.md); off by default")
    create.add_argument("--semantic-max-error", type=float, default=None, metavar="SHARE",
                        help="this key's bound on wrong semantic hits, above 0 and below 1 (default: SEMANTIC_MAX_ERROR, 0.02)")
    create.add_argument("--guardrails", metavar="JSON",
                        help="this key's guardrails policy, GUARDRAILS' format (docs/guardrails.md); default: the gateway's")
    create.set_defaults(run=lambda a: asyncio.run(_create(a)))
    listing = actions.add_parser("list", help="list keys as a table (never the secrets)", parents=[state])
    listing.add_argument("--json", action="store_true", help="one JSON record per line, times as epoch seconds")
    listing.set_defaults(run=lambda a: asyncio.run(_list(a)))
    for name, run in (("revoke", _revoke), ("rotate", _rotate)):
        action = actions.add_parser(name, help=f"{name} a key (edges that cached it accept it for up to 30 s)", parents=[state])
        action.add_argument("key_id")
        if name == "revoke":
            action.add_argument("--now", action="store_true", help="also drop it from a running edge's key cache (admin route)")
            action.add_argument("--edge", default="http://127.0.0.1:8787", help="the running edge for --now (default: %(default)s)")
            action.add_argument("--admin-token", help="its admin token for --now (default: $EDGELLM_ADMIN_TOKEN)")
        action.set_defaults(run=lambda a, run=run: asyncio.run(run(a)))
