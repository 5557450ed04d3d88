"""Data-loss prevention: find secrets and personal data in text, mask them, and unmask an answer.

Pure functions over `str`, stdlib only, so the Worker runs them with no package and no network.
Each detector is a regular expression that finds a candidate and a check that decides it (Luhn,
mod 97, a JOSE header, the registered lengths): the regex finds shapes, the check refuses the
near misses. Every repetition in every pattern is bounded and each pattern starts behind a
boundary look-behind, so a scan costs at most `MAX_SPAN` steps a character whatever the input;
`scan` reads a huge text in chunks that overlap by `MAX_SPAN`, and `Scanner` does the same over a
stream, so a finding split across two chunks or windows is still found whole.
"""

from __future__ import annotations

import bisect
import ipaddress
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from . import checksums

# The detectors a policy may name. Kept stable: the policy format and the metrics' labels use them.
DETECTORS: tuple[str, ...] = (
    "secret", "payment_card", "email", "phone", "iban", "ip_address", "us_ssn", "uk_nino",
)

# The longest text any pattern can match (a private key block, bounded below). Chunks and stream
# windows overlap by this much, so nothing a pattern can match is ever cut in two.
MAX_SPAN = 8192
CHUNK = 65536


@dataclass(frozen=True)
class Finding:
    """One match: `detector` is a policy name, `kind` the finer shape (e.g. `github_token`),
    `start:end` its span in the scanned text, `value` the text itself, `masked` what a log may show."""

    detector: str
    kind: str
    start: int
    end: int
    value: str
    masked: str

    def shifted(self, offset: int) -> "Finding":
        return Finding(self.detector, self.kind, self.start + offset, self.end + offset, self.value, self.masked)


# A check takes the match and answers the (start, end) of the finding within the match's text,
# or None when the candidate is a near miss.
Check = Callable[[re.Match[str]], "tuple[int, int] | None"]


@dataclass(frozen=True)
class _Pattern:
    detector: str
    kind: str
    regex: re.Pattern[str]
    check: Check | None = None
    hint: str | None = None  # a literal every match contains: a chunk without it is skipped


def _whole(match: re.Match[str]) -> tuple[int, int]:
    return match.span()


def _group(name: str) -> Check:
    def check(match: re.Match[str]) -> tuple[int, int]:
        return match.span(name)
    return check


def _digits(text: str) -> str:
    return "".join(char for char in text if char.isdigit())


_CARD_END = re.compile(r"(?![0-9A-Za-z_]|[.-][0-9])")


def _one_separator(text: str) -> bool:
    """Digits grouped by one kind of separator, or none: '4111 1111-1111 1111' is not a card."""
    return len({char for char in text if not char.isalnum()}) <= 1


def _card(match: re.Match[str]) -> tuple[int, int] | None:
    """The candidate may run on into an expiry date, a CVV or the next card ('4111 1111 1111 1111
    12/27'): the longest prefix that ends cleanly, uses one kind of separator and is a card wins.
    The match itself is one digit long (the rest is a look-ahead), so the next card is still read.
    One pass over the candidate (at most 37 characters), and none past a prefix no network issues."""
    text = match.string
    start = match.start()
    if text[start] not in "23456":  # no network issues numbers that start with 0, 1, 7, 8 or 9
        return None
    candidate = text[start:match.end("rest")]
    digits = _digits(candidate)
    if not checksums.card_prefix_known(digits):
        return None
    ends: list[tuple[int, int]] = []  # (end in the candidate, digits so far) where one separator kind holds
    separator = None
    count = 0
    for index, char in enumerate(candidate):
        if char.isdigit():
            count += 1
            if count > 19:
                break
            # a card ends where a group does (a digit never follows it)
            if count >= 12 and (index + 1 == len(candidate) or not candidate[index + 1].isdigit()):
                ends.append((index + 1, count))
        elif separator is None:
            separator = char
        elif char != separator:
            break
    for end, count in reversed(ends):
        if _CARD_END.match(text, start + end) and checksums.card_ok(digits[:count]):
            return start, start + end
    return None


def _iban(match: re.Match[str]) -> tuple[int, int] | None:
    """The candidate may run on into the next word ('... 3000 and'); take exactly the country's
    registered length of characters and check those. The match is one letter long (the rest is
    a look-ahead), so a candidate that ran on never hides the IBAN after it. People group an IBAN as they like (by
    four, as the bank prints it, with hyphens): any grouping by one kind of separator is read."""
    text = match.string[match.start():match.end("rest")]
    length = checksums.IBAN_LENGTHS.get(text[:2])
    if length is None:
        return None
    taken = 0
    for index, char in enumerate(text):
        if char.isalnum():
            taken += 1
            if taken == length:
                end = index + 1
                break
    else:
        return None
    if text[end:end + 1].isalnum() or not _one_separator(text[:end]):
        return None
    compact = "".join(char for char in text[:end] if char.isalnum()).upper()
    if not checksums.iban_ok(compact):
        return None
    return match.start(), match.start() + end


def _jwt(match: re.Match[str]) -> tuple[int, int] | None:
    return match.span() if checksums.jwt_ok(match.group()) else None


_OCTET = re.compile(r"25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]")


def _ipv4(match: re.Match[str]) -> tuple[int, int] | None:
    """Four decimal octets 0-255 without leading zeros (a leading zero reads as octal to some
    parsers and is how version numbers and dates are written, not addresses)."""
    if all(_OCTET.fullmatch(part) for part in match.group().split(".")):
        return match.span()
    return None


def _ipv6(match: re.Match[str]) -> tuple[int, int] | None:
    text = match.group()
    address = text.split("%", 1)[0]
    if sum(char.isalnum() for char in address) < 3:
        return None
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return None
    return match.span()


def _phone(match: re.Match[str]) -> tuple[int, int] | None:
    digits = _digits(match.group())
    if not 8 <= len(digits) <= 15:
        return None
    return match.span()


def _ssn(match: re.Match[str]) -> tuple[int, int] | None:
    return match.span() if checksums.ssn_ok(_digits(match.group())) else None


def _nino(match: re.Match[str]) -> tuple[int, int] | None:
    return match.span() if checksums.nino_ok(match.group().replace(" ", "").upper()) else None


_B = r"(?<![A-Za-z0-9_])"  # starts a token
_E = r"(?![A-Za-z0-9_])"  # ends one


def _lead(first: str, not_after: str) -> str:
    """A pattern's first character `first` (a class), not preceded by one of `not_after`: the
    boundary is checked after the first character, so the pattern starts with a character class
    and the regex engine skips ahead to candidates instead of trying every position (a pattern
    that starts with a look-behind is tried at each one: 5x slower on prose)."""
    return f"{first}(?<!{not_after}[\\s\\S])"


PATTERNS: tuple[_Pattern, ...] = (
    # --- secrets: the shapes their issuers document (and detect-secrets' plugins look for) ---
    _Pattern("secret", "private_key", re.compile(
        r"-----BEGIN [A-Z0-9]{1,20}(?: [A-Z0-9]{1,20}){0,3} ?PRIVATE KEY(?: BLOCK)?-----"
        r"[A-Za-z0-9+/=\s:,\-]{0,7900}?(?:-----END [A-Z0-9 ]{0,60}PRIVATE KEY(?: BLOCK)?-----|(?=[^A-Za-z0-9+/=\s:,\-])|\Z)"
        r"|-----BEGIN PRIVATE KEY-----[A-Za-z0-9+/=\s]{0,7900}?(?:-----END PRIVATE KEY-----|(?=[^A-Za-z0-9+/=\s])|\Z)"),
        _whole, "PRIVATE KEY"),
    _Pattern("secret", "aws_access_key_id", re.compile(
        _lead("A", "[A-Za-z0-9_]") + r"(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])[A-Z0-9]{16}" + _E), _whole, "A"),
    _Pattern("secret", "github_token", re.compile(
        _lead("g", "[A-Za-z0-9_]") + r"(?:h[pousr]_[A-Za-z0-9]{36}|ithub_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59})" + _E),
        _whole, "_"),
    _Pattern("secret", "slack_token", re.compile(
        _B + r"xox[abposr]-(?:[0-9]{1,15}-){1,4}[A-Za-z0-9]{8,64}" + _E), _whole, "xox"),
    _Pattern("secret", "slack_webhook", re.compile(
        r"https://hooks\.slack\.com/services/T[A-Za-z0-9_]{1,20}/B[A-Za-z0-9_]{1,20}/[A-Za-z0-9_]{1,40}"),
        _whole, "hooks.slack.com"),
    _Pattern("secret", "stripe_key", re.compile(
        _lead("[sr]", "[A-Za-z0-9_]") + r"k_(?:live|test)_[0-9A-Za-z]{24,99}" + _E), _whole, "k_"),
    _Pattern("secret", "openai_key", re.compile(
        _lead("s", "[A-Za-z0-9_-]") + r"k-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,200}"
        r"|[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}|[A-Za-z0-9]{48})(?![A-Za-z0-9_-])"), _whole, "sk-"),
    _Pattern("secret", "google_api_key", re.compile(
        r"(?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35}(?![A-Za-z0-9_-])"), _whole, "AIza"),
    _Pattern("secret", "jwt", re.compile(
        r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{5,2000}\.[A-Za-z0-9_-]{2,4000}\.[A-Za-z0-9_-]{0,1000}(?![A-Za-z0-9_-])"),
        _jwt, "eyJ"),
    # the password of a URL's userinfo (postgres://user:PASSWORD@host): only the password is the finding
    _Pattern("secret", "url_password", re.compile(
        r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{1,20}://[^\s:/@'\"<>]{1,128}:(?P<password>[^\s/@'\"<>]{1,128})@[A-Za-z0-9\[]"),
        _group("password"), "://"),
    # ADO.NET / ODBC style: "Server=db;User Id=sa;Password=PASSWORD;"
    _Pattern("secret", "connection_password", re.compile(
        r"(?i)(?<![A-Za-z0-9_])(?:user id|uid|user|username)=[^;\n]{1,32};[ ]{0,4}(?:password|pwd)=(?P<password>[^;\s'\"]{1,64})"),
        _group("password"), "="),
    # --- personal data ---
    _Pattern("payment_card", "payment_card", re.compile(
        # printed in groups of three or more (4-4-4-4, 4-6-5, 4-4-4-4-3; a short last group too)
        # or none: a run of one- and two-digit groups is never a card, and reading one would
        # cost a candidate at every digit
        _lead("[0-9]", "[0-9A-Za-z_.-]") + r"(?=(?P<rest>[0-9]{3,18}(?:[ -][0-9]{3,15}){0,5}(?:[ -][0-9]{1,2})?))"), _card),
    _Pattern("iban", "iban", re.compile(
        _lead("[A-Z]", "[A-Za-z0-9_]") + r"(?=(?P<rest>[A-Z][ -]?[0-9]{2}(?:[ -]?[A-Za-z0-9]){11,30}))"), _iban),
    _Pattern("email", "email", re.compile(
        r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9_%+-](?:[A-Za-z0-9._%+-]{0,62}[A-Za-z0-9_%+-])?@"
        r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,8}[A-Za-z]{2,24}(?![A-Za-z0-9_-]|\.[A-Za-z0-9])"),
        _whole, "@"),
    _Pattern("us_ssn", "us_ssn", re.compile(
        _lead("[0-9]", "[0-9A-Za-z_-]") + r"[0-9]{2}-[0-9]{2}-[0-9]{4}(?![0-9A-Za-z_]|-[0-9])"), _ssn, "-"),
    _Pattern("uk_nino", "uk_nino", re.compile(
        _lead("[A-CEGHJ-PR-TW-Z]", "[A-Za-z0-9_]") + r"[A-CEGHJ-NPR-TW-Z] ?[0-9]{2} ?[0-9]{2} ?[0-9]{2} ?[A-D](?![A-Za-z0-9_])"),
        _nino),
    # phones: E.164 with its '+', or a national format with the separators people write; a bare
    # run of digits is never a phone (order numbers, timestamps and ids are)
    _Pattern("phone", "phone", re.compile(
        _lead(r"\+", "[A-Za-z0-9_+]") + r"[1-9][0-9]{0,2}(?:[ .-]?\(?[0-9]{1,4}\)?){2,5}(?![0-9A-Za-z_]|[.-][0-9])"),
        _phone, "+"),
    _Pattern("phone", "phone", re.compile(
        _lead(r"\(", "[A-Za-z0-9_.+-]") + r"[2-9][0-9]{2}\) ?[2-9][0-9]{2}[-.][0-9]{4}(?![0-9A-Za-z_]|[.-][0-9])"),
        _phone, "("),
    _Pattern("phone", "phone", re.compile(
        _lead("[2-9]", "[A-Za-z0-9_.+(-]") + r"[0-9]{2}([-.])[2-9][0-9]{2}\1[0-9]{4}(?![0-9A-Za-z_]|[.-][0-9])"
        r"|" + _lead("0", "[A-Za-z0-9_.+-]") + r"(?:[1-9](?:([ .])[0-9]{2})(?:\2[0-9]{2}){3}"
        r"|7[0-9]{3} [0-9]{6}|20 [0-9]{4} [0-9]{4}|1[0-9]{2,3} [0-9]{3} ?[0-9]{3,4})(?![0-9A-Za-z_]|[.-][0-9])"),
        _phone),
    _Pattern("ip_address", "ipv4", re.compile(
        _lead("[0-9]", "[A-Za-z0-9_.]") + r"[0-9]{0,2}(?:\.[0-9]{1,3}){3}(?![A-Za-z0-9_]|\.[0-9])"), _ipv4, "."),
    _Pattern("ip_address", "ipv6", re.compile(
        _lead("[0-9A-Fa-f:]", "[A-Za-z0-9_:.]") + r"(?=[0-9A-Fa-f]{0,3}:[0-9A-Fa-f]{0,4}:|:)[0-9A-Fa-f:.]{1,44}(?:%[0-9A-Za-z]{1,16})?(?![A-Za-z0-9_:])"),
        _ipv6, ":"),
)

# When two findings overlap, the more specific detector keeps the span (a JWT is not an e-mail;
# a card number is not a phone number).
_PRIORITY = {"secret": 0, "payment_card": 1, "iban": 2, "us_ssn": 3, "uk_nino": 4, "email": 5, "ip_address": 6, "phone": 7}


def masked_form(detector: str, kind: str, value: str) -> str:
    """What a log line, trace or usage row may show instead of the value: the kind, and for a
    card its last four digits (what PCI DSS allows to be shown)."""
    if detector == "payment_card":
        return f"[payment_card ****{_digits(value)[-4:]}]"
    if detector == "secret":
        return f"[secret:{kind}]"
    return f"[{detector}]"


def _scan_chunk(text: str, enabled: frozenset[str] | None) -> list[Finding]:
    found: list[Finding] = []
    for pattern in PATTERNS:
        if enabled is not None and pattern.detector not in enabled:
            continue
        if pattern.hint is not None and pattern.hint not in text:
            continue
        for match in pattern.regex.finditer(text):
            span = (pattern.check or _whole)(match)
            if span is None:
                continue
            start, end = span
            value = text[start:end]
            found.append(Finding(pattern.detector, pattern.kind, start, end, value,
                                 masked_form(pattern.detector, pattern.kind, value)))
    return _resolve(found)


def _resolve(found: list[Finding]) -> list[Finding]:
    """No two findings overlap: within each run of overlapping findings the higher priority (then
    the longer, then the earlier) wins. Linear after the sort: a dense text has thousands."""
    found.sort(key=lambda f: (f.start, f.end))
    kept: list[Finding] = []
    cluster: list[Finding] = []
    reach = -1
    for finding in found + [None]:  # type: ignore[list-item]
        if finding is not None and finding.start < reach:
            cluster.append(finding)
            reach = max(reach, finding.end)
            continue
        if cluster:
            kept.extend(_pick(cluster))
        if finding is not None:
            cluster, reach = [finding], finding.end
    return kept


def _pick(cluster: list[Finding]) -> list[Finding]:
    if len(cluster) == 1:
        return cluster
    starts: list[int] = []  # the chosen findings, sorted by start; they never overlap
    chosen: list[Finding] = []
    for finding in sorted(cluster, key=lambda f: (_PRIORITY[f.detector], -(f.end - f.start), f.start)):
        at = bisect.bisect_left(starts, finding.start)
        if at < len(chosen) and chosen[at].start < finding.end:
            continue  # overlaps the next chosen one
        if at > 0 and chosen[at - 1].end > finding.start:
            continue  # overlaps the one before
        starts.insert(at, finding.start)
        chosen.insert(at, finding)
    return chosen


class Scanner:
    """Scans a text that arrives in pieces (a streamed answer's windows, a huge prompt's chunks).

    `feed` answers the findings that no later text can change, in stream offsets; `close` the
    rest. Text before `settled` is final: every finding that starts before it has been answered,
    so a streaming layer may release (masked) text up to `settled` and hold back only the tail.

    The tail held back is what a match could still be growing into: the last whitespace-free
    run (every pattern but a few short spaced ones and a private key block is one token), the
    last `SPACED_SPAN` characters (a card number or IBAN written in groups, a phone number), and
    an open private key block; never more than `MAX_SPAN`. The buffer holds that tail plus the
    new piece, and a long piece is read in CHUNK-sized steps."""

    def __init__(self, detectors: Iterable[str] | None = None) -> None:
        self._enabled = frozenset(detectors) if detectors is not None else None
        self._buffer = ""
        self._base = 0  # stream offset of the buffer's first character
        self._reported = 0  # stream offset before which every finding has been answered
        self._closed = False

    @property
    def settled(self) -> int:
        return self._reported

    def feed(self, text: str) -> list[Finding]:
        if self._closed:
            raise ValueError("the scanner is closed")
        self._buffer += text
        out: list[Finding] = []
        while len(self._buffer) > CHUNK + 2 * MAX_SPAN:
            window = self._buffer[:CHUNK + 2 * MAX_SPAN]
            # a match that starts before `cut` ends, with the character its look-ahead reads,
            # inside the window (MAX_SPAN bounds every match), so it is final
            out.extend(self._take(window, len(window) - MAX_SPAN - 1))
        cut = _safe_cut(self._buffer)
        if self._base + cut > self._reported:
            out.extend(self._take(self._buffer, cut))
        return out

    def close(self) -> list[Finding]:
        if self._closed:
            return []
        self._closed = True
        out = self._take(self._buffer, len(self._buffer))
        self._buffer = ""
        return out

    def _take(self, window: str, cut: int) -> list[Finding]:
        out = []
        for finding in _scan_chunk(window, self._enabled):
            absolute = finding.shifted(self._base)
            if absolute.start >= self._reported and finding.start < cut:
                out.append(absolute)
        self._reported = max(self._reported, self._base + cut, max((f.end for f in out), default=0))
        # every later finding starts at or after `_reported`; what a pattern reads before its
        # finding (a look-behind, a URL's scheme and user before its password) is kept
        drop = max(0, self._reported - self._base - CONTEXT)
        self._buffer = self._buffer[drop:]
        self._base += drop
        return out


# The longest match of a pattern that may hold a space (a grouped IBAN, at most 68 characters; a
# card or phone number; a connection string's user and password, bounded to fit): what a stream
# holds back when no longer token is open.
SPACED_SPAN = 128
# The most a pattern reads before the start of its finding (a URL's scheme and user name).
CONTEXT = 256
_OPEN_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]{0,80}PRIVATE KEY")
_KEY_END = re.compile(r"-----END [A-Z0-9 ]{0,60}PRIVATE KEY(?: BLOCK)?-----")


def _safe_cut(buffer: str) -> int:
    """Where the held-back tail of `buffer` starts (see `Scanner`)."""
    size = len(buffer)
    hold_from = size - SPACED_SPAN
    last_space = max(buffer.rfind(" "), buffer.rfind("\n"), buffer.rfind("\t"), buffer.rfind("\r"))
    hold_from = min(hold_from, last_space)
    tail = max(0, size - MAX_SPAN)
    opened = None
    for opened in _OPEN_KEY.finditer(buffer, tail):
        pass
    # open until its whole footer has arrived (a footer cut in two would end the block early)
    if opened is not None and not _KEY_END.search(buffer, opened.end()):
        hold_from = min(hold_from, opened.start())
    return max(0, hold_from, size - MAX_SPAN - 1)


def scan(text: str, detectors: Iterable[str] | None = None) -> list[Finding]:
    """Every finding in `text`, in order, none overlapping; in CHUNK-sized pieces, so a huge text
    costs linear time and bounded memory."""
    scanner = Scanner(detectors)
    found: list[Finding] = []
    for offset in range(0, len(text), CHUNK):
        found.extend(scanner.feed(text[offset:offset + CHUNK]))
    found.extend(scanner.close())
    return found


def scan_windows(windows: Iterable[str], detectors: Iterable[str] | None = None) -> Iterator[list[Finding]]:
    """For a stream of windows, the findings settled after each, then the rest at the end: one
    list per window plus a last one. Offsets are in the joined text."""
    scanner = Scanner(detectors)
    for window in windows:
        yield scanner.feed(window)
    yield scanner.close()


@dataclass(frozen=True)
class Masked:
    """A masked text, and what each placeholder stood for, to unmask an answer for the caller."""

    text: str
    placeholders: dict[str, str]


def mask(text: str, findings: Iterable[Finding]) -> Masked:
    """`text` with each finding replaced by a numbered placeholder (`[EMAIL_1]`); the same value
    gets the same placeholder, so the model still sees that two mentions are one."""
    by_value: dict[tuple[str, str], str] = {}
    counts: dict[str, int] = {}
    pieces: list[str] = []
    position = 0
    for finding in sorted(findings, key=lambda f: f.start):
        if finding.start < position:
            continue
        key = (finding.detector, finding.value)
        placeholder = by_value.get(key)
        if placeholder is None:
            counts[finding.detector] = counts.get(finding.detector, 0) + 1
            placeholder = f"[{finding.detector.upper()}_{counts[finding.detector]}]"
            by_value[key] = placeholder
        pieces.append(text[position:finding.start])
        pieces.append(placeholder)
        position = finding.end
    pieces.append(text[position:])
    return Masked("".join(pieces), {placeholder: value for (_, value), placeholder in by_value.items()})


def unmask(text: str, placeholders: dict[str, str]) -> str:
    """An answer with the placeholders the prompt's masking issued put back to their values;
    any other bracketed text is left as it is."""
    if not placeholders:
        return text
    pattern = re.compile("|".join(re.escape(p) for p in sorted(placeholders, key=len, reverse=True)))
    return pattern.sub(lambda match: placeholders[match.group()], text)


def redact(text: str, detectors: Iterable[str] | None = None) -> str:
    """`text` for a log line, trace or usage row: each finding replaced by its masked form."""
    findings = scan(text, detectors)
    pieces: list[str] = []
    position = 0
    for finding in findings:
        pieces.append(text[position:finding.start])
        pieces.append(finding.masked)
        position = finding.end
    pieces.append(text[position:])
    return "".join(pieces)
