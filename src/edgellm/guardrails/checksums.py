"""The checks that tell a real card number, IBAN or token from a string of the same shape.

Stdlib only (the Worker ships no packages). Each is a pure function of the candidate's text; the
tables name their source so a reader can hold them to it.
"""

from __future__ import annotations

import base64
import binascii
import json


def luhn_ok(digits: str) -> bool:
    """The Luhn mod-10 check (ISO/IEC 7812-1 annex B) that every payment card number carries."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


# Issuer identification number ranges and the lengths each network issues (the networks' own
# published rules, as summarised in ISO/IEC 7812 registrations): (prefix low, prefix high, lengths).
_CARD_RANGES: tuple[tuple[str, str, frozenset[int]], ...] = (
    ("4", "4", frozenset({13, 16, 19})),  # Visa
    ("51", "55", frozenset({16})),  # Mastercard
    ("2221", "2720", frozenset({16})),  # Mastercard 2-series
    ("34", "34", frozenset({15})),  # American Express
    ("37", "37", frozenset({15})),
    ("6011", "6011", frozenset({16, 17, 18, 19})),  # Discover
    ("644", "649", frozenset({16, 17, 18, 19})),
    ("65", "65", frozenset({16, 17, 18, 19})),
    ("622126", "622925", frozenset({16, 17, 18, 19})),  # Discover / UnionPay co-brand
    ("62", "62", frozenset({16, 17, 18, 19})),  # UnionPay
    ("3528", "3589", frozenset({16, 17, 18, 19})),  # JCB
    ("300", "305", frozenset({14, 16, 17, 18, 19})),  # Diners Club International
    ("36", "36", frozenset({14, 16, 17, 18, 19})),
    ("38", "39", frozenset({16, 17, 18, 19})),
    ("50", "50", frozenset({12, 13, 14, 15, 16, 17, 18, 19})),  # Maestro
    ("56", "58", frozenset({12, 13, 14, 15, 16, 17, 18, 19})),
    ("6759", "6759", frozenset({12, 13, 14, 15, 16, 17, 18, 19})),  # Maestro UK
    ("2200", "2204", frozenset({16, 17, 18, 19})),  # Mir
)


def card_issuer_ok(digits: str) -> bool:
    """Whether a network issues numbers with this prefix at this length."""
    for low, high, lengths in _CARD_RANGES:
        head = digits[: len(low)]
        if low <= head <= high and len(digits) in lengths:
            return True
    return False


def card_prefix_known(digits: str) -> bool:
    """Whether any network issues numbers that start like this (at any length)."""
    return any(low <= digits[: len(low)] <= high for low, high, _ in _CARD_RANGES)


def card_ok(digits: str) -> bool:
    return 12 <= len(digits) <= 19 and card_issuer_ok(digits) and luhn_ok(digits)


# IBAN length per country: the SWIFT IBAN Registry (release 99, 2025), the countries that
# issue IBANs. tests/unit/test_guardrails_dlp.py holds this table to schwifty's copy of the registry.
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HN": 28, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28,
    "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22,
    "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23,
    "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24,
    "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}


def iban_ok(compact: str) -> bool:
    """ISO 13616: the registered length for the country, and mod 97 of the rearranged number is 1."""
    if IBAN_LENGTHS.get(compact[:2]) != len(compact) or not compact[2:4].isdigit():
        return False
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(char, 36)) for char in rearranged)
    return int(number) % 97 == 1


def jwt_ok(token: str) -> bool:
    """RFC 7519: a JOSE header in the first part, a JSON object that names its `alg`."""
    header = token.split(".", 1)[0]
    try:
        raw = base64.urlsafe_b64decode(header + "=" * (-len(header) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError):
        return False
    return isinstance(value, dict) and isinstance(value.get("alg"), str)


# UK National Insurance number prefixes HMRC never issues (HMRC National Insurance Manual NIM39110).
_NINO_BAD_PREFIXES = frozenset({"BG", "GB", "NK", "KN", "TN", "NT", "ZZ"})


def nino_ok(compact: str) -> bool:
    return compact[:2] not in _NINO_BAD_PREFIXES


# SSNs the Social Security Administration says were never valid but are widely printed
# (advertising and example numbers).
_SSN_EXAMPLES = frozenset({"078051120", "219099999", "123456789"})


def ssn_ok(digits: str) -> bool:
    """No checksum exists: the SSA's ranges. Area 001-899 but 666, group 01-99, serial 0001-9999."""
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return (
        area != "000" and area != "666" and area < "900"
        and group != "00" and serial != "0000" and digits not in _SSN_EXAMPLES
    )
