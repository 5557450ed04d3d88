"""Guardrails: each DLP detector's precision and recall on labelled real formats, its false
positives on ordinary prose, and the scanner's throughput; then (`--moderation`, or alone with
`--moderation-only`) what the answer's windows add to the time to first token and to the gaps
between tokens, with and without answer checks in the same run (ratios), for several window
sizes, and what the prompt check adds to a request.

The moderation figures use a guard double that answers after a stated latency (asyncio sleep,
`--guard-ms`) and a token source paced at a stated gap (`--token-ms`): the check's own cost and
its holding back are measured, the guard model's speed is the parameter.

Corpora (read at bench time from registry packages, never copied into the repository):
- IBANs: the IBAN Registry's sample numbers, and numbers with broken checksums or lengths, from
  python-stdnum's own test file (`tests/test_iban.doctest` in its sdist, `pip download`ed).
- payment cards: the test card numbers the processors publish for their sandboxes (Stripe's
  "Testing" page, PayPal's and Adyen's test card lists), written plain and grouped as printed;
  negatives: each with its last digit changed (Luhn fails) and bare 16-digit order numbers.
- phones: every region's example fixed-line and mobile number from Google's libphonenumber
  metadata (the `phonenumbers` package), in E.164 and international format, and in national
  format for the plans the detector reads (US, GB, FR).
- e-mail: the Author-email / Maintainer-email addresses in this venv's installed packages'
  METADATA (addresses written by other people, in the wild).
- IP addresses: the networks of the stdlib's IANA special-purpose tables (`ipaddress`).
- secrets: the example credentials vendors print in their docs (AWS's `AKIAIOSFODNN7EXAMPLE`,
  jwt.io's token, Stripe's documented test key, ...) and keys of each documented shape generated
  here: a regression set, not evidence (detect-secrets' sdist ships no fixtures); detect-secrets'
  plugins are run over the same lines and their verdicts are printed beside ours.
- prose: this repository's docs (docs/*.md, README.md) and Jane Austen's six novels (public
  domain; Debian's `r-cran-janeaustenr`, its R data file read here without R).

    .venv/bin/python -m bench.bench_guardrails [--cache DIR]
"""

from __future__ import annotations

import argparse
import glob
import ipaddress
import math
import random
import re
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from importlib import metadata
from pathlib import Path

from edgellm.guardrails import dlp

ROOT = Path(__file__).resolve().parent.parent

# Published sandbox card numbers (Stripe "Testing" docs; PayPal and Adyen test card lists).
TEST_CARDS = [
    "4242424242424242", "4000056655665556", "5555555555554444", "2223003122003222", "5200828282828210",
    "5105105105105100", "378282246310005", "371449635398431", "6011111111111117", "6011000990139424",
    "6011981111111113", "3056930009020004", "36227206271667", "3566002020360505", "6200000000000005",
    "4111111111111111", "4012888888881881", "4222222222222", "5431111111111111", "6011601160116611",
    "340000000000009", "30569309025904", "3530111333300000", "6759649826438453", "6555900000604105",
]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def grouped(number: str) -> str:
    if len(number) == 15 and number[0] == "3":
        return f"{number[:4]} {number[4:10]} {number[10:]}"
    return " ".join(number[i:i + 4] for i in range(0, len(number), 4))


def fetch(cache: Path, what: str, command: list[str], pattern: str) -> Path:
    found = sorted(cache.glob(pattern))
    if not found:
        subprocess.run(command, cwd=cache, check=True, capture_output=True)
        found = sorted(cache.glob(pattern))
    if not found:
        raise SystemExit(f"could not fetch {what}")
    return found[-1]


def stdnum_ibans(cache: Path) -> tuple[list[str], list[str], list[str]]:
    """(registry samples, broken checksums or lengths, checksum-valid with letters where the
    country's BBAN has digits) from python-stdnum's test file."""
    sdist = fetch(cache, "python-stdnum's sdist",
                  [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps", "python-stdnum", "-d", "."],
                  "python_stdnum-*.tar.gz")
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("tests/test_iban.doctest"))
        text = tar.extractfile(member).read().decode()
    blocks = re.findall(r">>> numbers = '''\n(.*?)\.\.\. '''", text, re.S)
    parsed = [[line[4:].strip() for line in block.splitlines() if line.startswith("... ") and line[4:].strip()] for block in blocks]
    return parsed[0], parsed[1] + parsed[2], parsed[3]


def austen(cache: Path) -> list[str]:
    deb = fetch(cache, "r-cran-janeaustenr", ["apt-get", "download", "r-cran-janeaustenr"], "r-cran-janeaustenr_*.deb")
    out = cache / "janeaustenr"
    rdb = out / "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
    if not rdb.exists():
        subprocess.run(["dpkg-deb", "-x", str(deb), str(out)], check=True)
    data = rdb.read_bytes()
    lines: list[str] = []
    position = 0
    while position < len(data):  # each object: a 4-byte length, then zlib of R's XDR serialization
        inflater = zlib.decompressobj()
        raw = inflater.decompress(data[position + 4:])
        position = len(data) - len(inflater.unused_data)
        lines += _r_character_vector(raw)
    return lines


def _r_character_vector(raw: bytes) -> list[str]:
    """An R character vector (STRSXP) from its XDR serialization (R Internals, "Serialization
    Formats"): header, then the vector's flags and length, then each CHARSXP's flags, length, bytes."""
    position = 2 + 12
    (encoding_length,) = struct.unpack(">i", raw[position:position + 4])
    position += 4 + encoding_length
    flags, length = struct.unpack(">ii", raw[position:position + 8])
    assert flags & 0xFF == 16, "not a character vector"
    position += 8
    items = []
    for _ in range(length):
        _, size = struct.unpack(">ii", raw[position:position + 8])
        position += 8
        if size >= 0:
            items.append(raw[position:position + size].decode("utf-8", errors="replace"))
            position += size
    return items


def phone_examples() -> tuple[list[str], list[str]]:
    import phonenumbers
    from phonenumbers import PhoneNumberFormat as F, PhoneNumberType as T

    international, national = [], []
    for region in sorted(phonenumbers.SUPPORTED_REGIONS):
        for kind in (T.FIXED_LINE, T.MOBILE):
            number = phonenumbers.example_number_for_type(region, kind)
            if number is None:
                continue
            for style in (F.E164, F.INTERNATIONAL):
                international.append(phonenumbers.format_number(number, style))
            if region in ("US", "GB", "FR"):
                national.append(phonenumbers.format_number(number, F.NATIONAL))
    return international, national


def package_emails() -> list[str]:
    found = set()
    for dist in metadata.distributions():
        for field in ("Author-email", "Maintainer-email"):
            for value in dist.metadata.get_all(field) or []:
                found.update(re.findall(r"<([^<>\s]+@[^<>\s]+)>", value))
                found.update(v.strip() for v in value.split(",") if "<" not in v and "@" in v)
    return sorted(found)


def ip_examples() -> list[str]:
    from ipaddress import _IPv4Constants, _IPv6Constants  # type: ignore[attr-defined]

    nets = list(_IPv4Constants._private_networks) + list(_IPv6Constants._private_networks)
    addresses = {str(net.network_address) for net in nets} | {str(net[1]) for net in nets if net.num_addresses > 1}
    return sorted(a for a in addresses if a not in ("::", "0.0.0.0"))


def secret_examples() -> list[tuple[str, str]]:
    rng = random.Random(5)
    alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    pick = lambda n, chars=alnum: "".join(rng.choice(chars) for _ in range(n))  # noqa: E731
    documented = [
        ("aws_access_key_id", "AKIAIOSFODNN7EXAMPLE"),  # AWS docs' example access key id
        ("jwt", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ."
                "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),  # jwt.io's example
        ("stripe_key", "sk_test_4eC39HqLyjWDarjtT1zdp7dc"),  # Stripe's documented test key
        ("slack_webhook", "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"),  # Slack's docs
    ]
    generated = []
    for _ in range(20):
        generated += [
            ("aws_access_key_id", "AKIA" + pick(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")),
            ("github_token", rng.choice(["ghp", "gho", "ghu", "ghs", "ghr"]) + "_" + pick(36)),
            ("github_token", "github_pat_" + pick(22) + "_" + pick(59)),
            ("slack_token", "xoxb-" + pick(11, "0123456789") + "-" + pick(13, "0123456789") + "-" + pick(24)),
            ("stripe_key", "sk_live_" + pick(24)),
            ("openai_key", "sk-" + pick(20) + "T3BlbkFJ" + pick(20)),
            ("openai_key", "sk-proj-" + pick(64, alnum + "_-")),
            ("google_api_key", "AIza" + pick(35, alnum + "_-")),
            ("url_password", f"postgres://app:{pick(16)}@db.internal:5432/app"),
        ]
    return documented + generated


def measure(lines: list[str], detector: str, wanted: str | None = None) -> int:
    """How many lines the detector finds (exactly `wanted`, when given, as one whole finding)."""
    hits = 0
    for line in lines:
        found = [f for f in dlp.scan(f"see {line} here", [detector])]
        if wanted == "exact":
            hits += any(f.value == line for f in found)
        else:
            hits += bool(found)
    return hits


def row(name: str, k: int, n: int) -> str:
    low, high = wilson(k, n)
    return f"  {name:<44} {k:>5}/{n:<5} = {k / n if n else 0:6.1%}  (95% CI {low:.1%}-{high:.1%})"


def prose_report(name: str, lines: list[str], show: int = 8) -> None:
    lines = [line for line in lines if line.strip()]
    found_lines = 0
    by_detector: dict[str, int] = {}
    values: dict[str, int] = {}
    for line in lines:
        found = dlp.scan(line)
        if found:
            found_lines += 1
            for f in found:
                by_detector[f.detector] = by_detector.get(f.detector, 0) + 1
                values[f"{f.detector}:{f.value!r}"] = values.get(f"{f.detector}:{f.value!r}", 0) + 1
    examples = [f"{value} x{count}" for value, count in sorted(values.items(), key=lambda kv: -kv[1])[:show]]
    low, high = wilson(found_lines, len(lines))
    print(f"  {name}: {found_lines} of {len(lines)} non-empty lines with a finding = {1000 * found_lines / len(lines):.2f} per 1,000 "
          f"(95% CI {1000 * low:.2f}-{1000 * high:.2f}); by detector {by_detector or '{}'}")
    for example in examples:
        print(f"      {example}")


def throughput(name: str, text: str, repeat: int = 3) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        dlp.scan(text)
        best = min(best, time.perf_counter() - start)
    rate = len(text.encode()) / 1e6 / best
    print(f"  {name:<44} {len(text) / 1e6:5.2f} MB in {best * 1000:7.1f} ms = {rate:6.2f} MB/s")
    return rate


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "edgellm-bench-guardrails")
    parser.add_argument("--moderation", action="store_true", help="also the moderation figures")
    parser.add_argument("--moderation-only", action="store_true", help="only the moderation figures")
    parser.add_argument("--guard-ms", type=float, default=20.0, help="the guard double's latency (default: %(default)s)")
    parser.add_argument("--token-ms", type=float, default=20.0, help="the paced gap between tokens (default: %(default)s)")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.moderation_only:
        return moderation(args.guard_ms / 1000, args.token_ms / 1000)

    print("DLP recall on real formats (a finding of exactly the value, inside a sentence)")
    valid_ibans, broken_ibans, lettered_ibans = stdnum_ibans(args.cache)
    print(row("iban: IBAN Registry samples (python-stdnum)", measure(valid_ibans, "iban", "exact"), len(valid_ibans)))
    cards = TEST_CARDS + [grouped(c) for c in TEST_CARDS]
    print(row("payment_card: processors' test numbers", measure(cards, "payment_card", "exact"), len(cards)))
    international, national = phone_examples()
    long_enough = [p for p in international if len(re.sub(r"\D", "", p)) >= 8]
    print(row("phone: libphonenumber examples, E.164/intl (>=8 digits)", measure(long_enough, "phone", "exact"), len(long_enough)))
    print(row("phone: libphonenumber examples, national US/GB/FR", measure(national, "phone", "exact"), len(national)))
    emails = package_emails()
    print(row("email: installed packages' author addresses", measure(emails, "email", "exact"), len(emails)))
    ips = ip_examples()
    print(row("ip_address: IANA special-purpose networks", measure(ips, "ip_address", "exact"), len(ips)))
    secrets = secret_examples()
    print(row("secret: documented examples + shapes (regression)", measure([s for _, s in secrets if "://" not in s], "secret", "exact")
              + sum(bool(dlp.scan(s, ["secret"])) for _, s in secrets if "://" in s), len(secrets)))
    try:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        plugins = [cls() for cls in get_mapping_from_secret_type_to_class().values()
                   if cls.__name__ not in ("Base64HighEntropyString", "HexHighEntropyString", "KeywordDetector")]
        flagged = sum(any(list(p.analyze_string(s)) for p in plugins) for _, s in secrets)
        print(row("  detect-secrets' pattern plugins on the same", flagged, len(secrets)))
    except ImportError:
        print("  (detect-secrets not installed: pip install -e .[test])")

    print("\nDLP precision: near misses that must not be found")
    print(row("iban: broken checksum or length (python-stdnum)", len(broken_ibans) - measure(broken_ibans, "iban"), len(broken_ibans)))
    print(f"  iban: checksum-valid but letters where the BBAN has digits: {measure(lettered_ibans, 'iban')}/{len(lettered_ibans)} "
          "found (the BBAN's per-country format is not checked: they look like IBANs and are masked)")
    rng = random.Random(9)
    bad_luhn = [c[:-1] + str((int(c[-1]) + 1) % 10) for c in TEST_CARDS]
    order_numbers = []
    while len(order_numbers) < 2000:
        digits = str(rng.randrange(10 ** 15, 10 ** 16))
        order_numbers.append(digits)
    print(row("payment_card: test numbers with a wrong last digit", len(bad_luhn) - measure(bad_luhn, "payment_card"), len(bad_luhn)))
    found_orders = measure(order_numbers, "payment_card")
    print(f"  payment_card: random 16-digit numbers found {found_orders}/2000 = {found_orders / 20:.2f}% "
          "(expected ~10% pass Luhn x the share with an issuer's prefix: a random number can be a card's)")

    print("\nFindings in prose (in the book every one would be false; the docs' distinct values are listed to judge)")
    docs = []
    for path in sorted(glob.glob(str(ROOT / "docs" / "*.md"))) + [str(ROOT / "README.md")]:
        if Path(path).name != "guardrails.md":  # the detectors' own catalogue of examples
            docs += Path(path).read_text().splitlines()
    prose_report("this repository's docs", docs)
    book = austen(args.cache)
    prose_report("Jane Austen's six novels (r-cran-janeaustenr)", book)

    print("\nThroughput (scan: every detector, chunked; best of 3)")
    book_text = "\n".join(book)
    throughput("prose: Austen, first 1 MB", book_text[:1_000_000])
    throughput("prose: the docs", "\n".join(docs))
    dense = " ".join(f"mail a{i}@example.com card {TEST_CARDS[i % len(TEST_CARDS)]} ip 10.0.{i % 250}.1" for i in range(12000))[:1_000_000]
    throughput("dense findings (a third of the words)", dense)
    for name, text in {
        "hostile: 1 MB of one letter": "a" * 1_000_000,
        "hostile: 1 MB of digits": "1" * 1_000_000,
        "hostile: '1 ' x 500k": "1 " * 500_000,
        "hostile: 'a@' x 500k": "a@" * 500_000,
        "hostile: 'a:' x 500k": "a:" * 500_000,
        "hostile: an open private key block": "-----BEGIN RSA PRIVATE KEY-----\n" + "A" * 999_968,
        "hostile: '4111 ' x 200k (card-like groups)": "4111 " * 200_000,
        "hostile: '4242 ' x 200k (50k real cards)": "4242 " * 200_000,
    }.items():
        throughput(name, text, repeat=1)
    scanner = dlp.Scanner()
    window = book_text[:200_000]
    start = time.perf_counter()
    pieces = [window[i:i + 24] for i in range(0, len(window), 24)]
    for piece in pieces:
        scanner.feed(piece)
    scanner.close()
    spent = time.perf_counter() - start
    print(f"  stream: {len(pieces)} windows of 24 chars (a few tokens each): {spent / len(pieces) * 1e6:.0f} us a window, "
          f"{len(window.encode()) / 1e6 / spent:.2f} MB/s")
    if args.moderation:
        return moderation(args.guard_ms / 1000, args.token_ms / 1000)
    return 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def moderation(guard_s: float, token_s: float, tokens: int = 96, runs: int = 5) -> int:
    import asyncio
    import json as json_module
    import logging
    from dataclasses import replace as dc_replace

    from edgellm.app import handle
    from edgellm.config import Config
    from edgellm.deps import Deps
    from edgellm.generation import Finish, Token, Usage
    from edgellm.guardrails.answer import AnswerCheck, AnswerVerdicts, checked_answer
    from edgellm.guardrails.policy import parse_policy
    from edgellm.http import Request
    from edgellm.ports import Verdict
    from edgellm_local.doubles.scripted import ScriptedAI

    class LatencyGuard:
        def __init__(self, latency: float) -> None:
            self.latency, self.calls = latency, 0

        async def classify(self, messages: list) -> Verdict:
            self.calls += 1
            await asyncio.sleep(self.latency)
            return Verdict(True)

    words = book_words = ("the quick brown fox jumps over the lazy dog and then some more words follow here " * 20).split()

    async def paced():  # a generation's events at a steady pace (the model's)
        for i in range(tokens):
            await asyncio.sleep(token_s)
            yield Token(words[i % len(words)] + " ")
        yield Finish("stop", Usage(10, tokens))

    async def timed(events) -> tuple[float, list[float]]:
        start = time.perf_counter()
        stamps = []
        async for event in events:
            if isinstance(event, Token):
                stamps.append(time.perf_counter())
        return stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])]

    def summary(results: list[tuple[float, list[float]]]) -> tuple[float, float, float]:
        ttft = sorted(r[0] for r in results)[len(results) // 2]
        gaps = [g for r in results for g in r[1]]
        return ttft, percentile(gaps, 0.5), percentile(gaps, 0.99)

    async def run() -> None:
        print(f"\nModeration of answers: {tokens} tokens paced {token_s * 1000:.0f} ms apart, a guard answering in "
              f"{guard_s * 1000:.0f} ms; median of {runs} runs; ratios to the same stream unchecked, same run")
        base = summary([await timed(paced()) for _ in range(runs)])
        print(f"  {'unchecked':<26} TTFT {base[0] * 1000:7.1f} ms  gap p50 {base[1] * 1000:6.1f} ms  p99 {base[2] * 1000:6.1f} ms")
        config = Config(guard_timeout_seconds=30)
        conversation = ({"role": "user", "content": "tell me a story"},)
        for label, policy, window in [("DLP only (scanner hold-back)", {"dlp": {"email": "mask", "secret": "block"}}, 0),
                                      *((f"guard, window {w} tokens", {"moderation": {"answer": {"S1": "block"}}}, w) for w in (4, 8, 16, 32)),
                                      ("guard w16 + DLP", {"moderation": {"answer": {"S1": "block"}}, "dlp": {"email": "mask"}}, 16)]:
            guard = LatencyGuard(guard_s)
            deps = Deps(config=config, ai=ScriptedAI(), guard=guard, log=logging.getLogger("bench"))
            check = AnswerCheck(parse_policy(policy), conversation, window, AnswerVerdicts())
            figures = summary([await timed(checked_answer(paced(), deps, check, True)) for _ in range(runs)])
            print(f"  {label:<26} TTFT {figures[0] * 1000:7.1f} ms ({figures[0] / base[0]:5.2f}x)  gap p50 {figures[1] * 1000:6.1f} ms "
                  f"({figures[1] / base[1]:4.2f}x)  p99 {figures[2] * 1000:6.1f} ms ({figures[2] / base[2]:5.2f}x)  "
                  f"guard calls {guard.calls // runs}")

        print("\nThe prompt check: a chat request through app.handle (scripted model, no cache), median of 200")
        body = json_module.dumps({"messages": [{"role": "system", "content": "You are helpful."},
                                               {"role": "user", "content": " ".join(words[:300]) + " mail me at jane@example.com"}]}).encode()

        async def request_ms(deps: Deps, n: int = 200) -> float:
            spent = []
            for _ in range(n):
                start = time.perf_counter()
                response = await handle(Request("POST", "http://edge.test/v1/chat/completions", {}, body), deps)
                assert response.status == 200, response.body
                spent.append(time.perf_counter() - start)
            return percentile(spent, 0.5) * 1000

        plain = Deps(config=Config(open_access=True), ai=ScriptedAI(), log=logging.getLogger("bench"))
        base_ms = await request_ms(plain)
        print(f"  {'no guardrails':<36} {base_ms:6.2f} ms")
        for label, policy, latency in [("DLP (mask email, block secret)", {"dlp": {"email": "mask", "secret": "block"}}, 0.0),
                                       ("guard at 0 ms", {"moderation": {"prompt": {"S1": "block"}}}, 0.0),
                                       (f"guard at {guard_s * 1000:.0f} ms", {"moderation": {"prompt": {"S1": "block"}}}, guard_s)]:
            deps = dc_replace(plain, config=Config(open_access=True, guardrails=parse_policy(policy)), guard=LatencyGuard(latency))
            ms = await request_ms(deps, 200 if latency == 0 else 20)
            print(f"  {label:<36} {ms:6.2f} ms (+{ms - base_ms:.2f} ms, {ms / base_ms:.2f}x)")

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
