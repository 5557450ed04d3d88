"""`edgellm keys create|list|revoke|rotate`: API keys in the local edge's KV (`.state/kv.sqlite3`).

Each change also prints the `wrangler kv key put` command that writes the same record to the
Worker's real namespace (the `CACHE` binding), so a key made here can be deployed as is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from edgellm.access.keys import KeyRecord, KeyRing, new_key, rotated

from .kv import SqliteKV


def wrangler_put(record: KeyRecord, binding: str = "CACHE") -> str:
    return (f"npx wrangler kv key put --binding {binding} --remote {shlex.quote(record.kv_key)} "
            f"{shlex.quote(record.encode().decode())} --metadata {shlex.quote(json.dumps({'tenant': record.tenant}))}")


def _ring(args: argparse.Namespace) -> KeyRing:
    return KeyRing(SqliteKV(Path(args.state) / "kv.sqlite3"))


async def _create(args: argparse.Namespace) -> int:
    try:
        made = new_key(args.tenant, time.time(), requests_per_minute=args.rpm, tokens_per_minute=args.tpm,
                       token_budget=args.budget, models=tuple(args.model or ()), share_cache=args.share_cache, name=args.name or "")
    except ValueError as exc:
        print(f"edgellm: error: {exc}", file=sys.stderr)
        return 2
    await _ring(args).put(made.record)
    print(f"key id {made.record.key_id} for tenant {made.record.tenant} (shown once; only its hash is stored):")
    print(made.api_key)
    print(f"on Cloudflare: {wrangler_put(made.record)}")
    return 0


async def _list(args: argparse.Namespace) -> int:
    for record in await _ring(args).list():
        print(json.dumps(record.public_json(), sort_keys=True))
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
    print(f"revoked {record.key_id} (edges see it within 30 s)")
    print(f"on Cloudflare: {wrangler_put(revoked)}")
    return 0


async def _rotate(args: argparse.Namespace) -> int:
    ring = _ring(args)
    record = await _find(ring, args.key_id)
    if record is None:
        return 1
    old, made = rotated(record, time.time())
    await ring.put(made.record)
    await ring.put(old)
    print(f"revoked {old.key_id}; new key id {made.record.key_id} for tenant {made.record.tenant}:")
    print(made.api_key)
    print(f"on Cloudflare: {wrangler_put(made.record)}")
    print(f"on Cloudflare: {wrangler_put(old)}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    keys = sub.add_parser("keys", help="manage API keys (local KV; prints the wrangler command for Cloudflare)")
    keys.add_argument("--state", default=".state", help="the local edge's state directory")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a key for a tenant")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", help="a label")
    create.add_argument("--rpm", type=int, default=60, help="requests per minute (0: unlimited)")
    create.add_argument("--tpm", type=int, default=0, help="tokens per minute (0: unlimited)")
    create.add_argument("--budget", type=int, default=0, help="lifetime token budget (0: none)")
    create.add_argument("--model", action="append", help="a model the key may use (repeat; default: all)")
    create.add_argument("--share-cache", action="store_true", help="share cache entries with other tenants that share")
    create.set_defaults(run=lambda a: asyncio.run(_create(a)))
    actions.add_parser("list", help="list keys (never the secrets)").set_defaults(run=lambda a: asyncio.run(_list(a)))
    for name, run in (("revoke", _revoke), ("rotate", _rotate)):
        action = actions.add_parser(name, help=f"{name} a key")
        action.add_argument("key_id")
        action.set_defaults(run=lambda a, run=run: asyncio.run(run(a)))
