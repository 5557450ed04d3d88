"""schema_bounds: each bound exactly at its limit is accepted and one past it refused, with the
code a client can branch on (`schema_too_complex`, `unsupported_schema`, `invalid_schema`), and
pattern_size counts what llama.cpp's regex converter unrolls a pattern to. Pure functions in,
refusal or acceptance out: the edge tests hold the same bounds against real llama.cpp."""

from __future__ import annotations

from typing import Any

import pytest

from edgellm.errors import GatewayError
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm.schema_bounds import (MAX_ALTERNATIVES, MAX_EXPANSION, MAX_INTEGER, MAX_LITERAL_CHARS, MAX_PATTERN_CHARS,
                                   MAX_REPETITION, MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES, check_schema, check_together,
                                   pattern_size)

WHERE = "response_format.json_schema.schema"
TOO_COMPLEX, UNSUPPORTED, INVALID = "schema_too_complex", "unsupported_schema", "invalid_schema"


def refusal(schema: Any) -> GatewayError:
    with pytest.raises(GatewayError) as refused:
        check_schema(schema, WHERE)
    return refused.value


def nested(levels: int) -> dict[str, Any]:
    """A string schema `levels` arrays deep: the innermost schema is at depth `levels`."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def props(count: int, sub: dict[str, Any] | None = None, required: bool = True) -> dict[str, Any]:
    properties = {f"p{i}": dict(sub or {"type": "string"}) for i in range(count)}
    return {"type": "object", "properties": properties, **({"required": list(properties)} if required else {})}


def enum_of(count: int) -> dict[str, Any]:
    return {"enum": [f"v{i}" for i in range(count)]}


def integer(**bounds: Any) -> dict[str, Any]:
    return {"type": "integer", **bounds}


def expanding(last_length: int) -> dict[str, Any]:
    """Root (1) + 32 strings of maxLength 2000 (2001 each) + one of `last_length` (1 + it):
    65536 grammar elements at last_length 1502."""
    schema = props(32, {"type": "string", "maxLength": MAX_REPETITION})
    schema["properties"]["last"] = {"type": "string", "maxLength": last_length}
    return schema


def string(pattern: str) -> dict[str, Any]:
    return {"type": "string", "pattern": pattern}


# pattern -> how many grammar elements it unrolls to
PATTERN_SIZES = {
    "^$": 0,
    "^abc$": 3,
    "^ab|c$": 3,  # alternatives add up: the grammar holds them all
    "^(ab)$": 2,
    "^(a|bc)d$": 4,
    "^((ab)c)$": 3,
    "^a{3}$": 3,
    "^a{2,5}$": 5,  # unrolled to the maximum
    "^a{3,}$": 3,
    "^a{0}$": 1,
    "^a{1}$": 1,
    "^(ab){3}$": 6,
    "^(a|b){3}$": 6,
    "^((ab)c){2}$": 6,
    "^a*b+c?$": 3,  # a quantifier adds nothing of its own
    "^(ab|c)*$": 3,
    "^[a-z]$": 1,
    "^[a-z]{4}x$": 5,
    "^[]a]$": 1,  # a ']' first in a class is a character
    "^[^]a]b$": 2,
    "^[\\]a]b$": 2,  # an escaped ']' does not close the class
    "^[a\\-z]b$": 2,
    "^\\.\\n\\\\$": 3,  # escapes are one character each, a final escaped backslash included
    "^\\$$": 1,
    "^a.b$": 3,
    "^(a{2000})$": 2000,
    "^a{2000}b{2000}$": 4000,
    "^\\.+$": 1,  # an escape can be repeated
    "^[a-z]+$": 1,  # so can a class
    "^[]]$": 1,
    "^[a]b]$": 3,  # only a ']' right after '[' or '[^' is a character
    "^a}~$": 3,
    "^[^]]$": 1,
    "^[\\]]$": 1,
}


@pytest.mark.parametrize("pattern", PATTERN_SIZES)
def test_pattern_size_counts_what_the_pattern_unrolls_to(pattern: str) -> None:
    assert pattern_size(pattern) == PATTERN_SIZES[pattern]
    check_schema(string(pattern), WHERE)


def test_a_pattern_unrolling_to_exactly_the_expansion_bound_is_counted_and_one_more_refused() -> None:
    at_bound = "^(a{2000}){32}b{1536}$"  # 2000 * 32 + 1536
    assert pattern_size(at_bound) == MAX_EXPANSION
    error = refusal(string(at_bound.replace("1536", "1537")))
    assert (error.code, error.param) == (INVALID, WHERE)
    assert f"unrolls to more than {MAX_EXPANSION}" in error.message
    # the pattern alone fits, its schema node does not: the whole schema is bounded too
    assert f"expands to more than {MAX_EXPANSION}" in refusal(string(at_bound)).message


def test_a_pattern_of_exactly_the_longest_length_is_accepted_and_one_more_character_refused() -> None:
    longest = "^" + "a" * (MAX_PATTERN_CHARS - 2) + "$"
    assert pattern_size(longest) == MAX_PATTERN_CHARS - 2
    error = refusal(string(longest[:-1] + "a$"))
    assert (error.code, f"longer than {MAX_PATTERN_CHARS} characters" in error.message) == (INVALID, True)


# pattern -> (code, a fragment of the message)
PATTERN_REFUSED = {
    "abc$": (UNSUPPORTED, "must start with '^' and end with '$'"),
    "^abc": (UNSUPPORTED, "must start with '^'"),
    "^abc\\$": (UNSUPPORTED, "must start with '^'"),  # an escaped '$' is a character, not an anchor
    "^\\\\\\$": (UNSUPPORTED, "must start with '^'"),
    "^\\d$": (UNSUPPORTED, "the escape '\\d'"),
    "^a\\p{L}$": (UNSUPPORTED, "the escape '\\p'"),
    "^(a)\\1$": (UNSUPPORTED, "the escape '\\1'"),
    "^[\\d]$": (UNSUPPORTED, "the escape '\\d' in a class"),
    "^[a\\$": (UNSUPPORTED, "must start with '^'"),  # so a class, like the pattern, never ends on a lone backslash
    "^[[:alpha:]]$": (UNSUPPORTED, "a nested or POSIX class"),
    "^[abc$": (INVALID, "a '[' without its ']'"),
    "^[$": (INVALID, "a '[' without its ']'"),
    "^[^$": (INVALID, "a '[' without its ']'"),
    "^((a{2000}){33})$": (INVALID, f"unrolls to more than {MAX_EXPANSION}"),  # counted inside a group too
    "^[]$": (INVALID, "a '[' without its ']'"),  # ']' first is a character: the class is still open
    "^[^]$": (INVALID, "a '[' without its ']'"),
    "^[\\]$": (INVALID, "a '[' without its ']'"),
    "^(?=a)a$": (UNSUPPORTED, "a '(?' group"),
    "^(?:a)$": (UNSUPPORTED, "a '(?' group"),
    "^a)$": (INVALID, "a ')' without its '('"),
    "^(a$": (INVALID, "a '(' without its ')'"),
    "^((a)$": (INVALID, "a '(' without its ')'"),
    "^*a$": (INVALID, "a '*' with nothing to repeat"),
    "^a**$": (INVALID, "a '*' with nothing to repeat"),
    "^(+)$": (INVALID, "a '+' with nothing to repeat"),
    "^a|?$": (INVALID, "a '?' with nothing to repeat"),  # llama.cpp's grammar parser refuses these three
    "^a(*)$": (INVALID, "a '*' with nothing to repeat"),
    "^(a|+b)$": (INVALID, "a '+' with nothing to repeat"),
    "^a|{2}$": (INVALID, "a repetition with nothing to repeat"),
    "^a*?$": (UNSUPPORTED, "a lazy or possessive quantifier ('*?')"),
    "^a++$": (UNSUPPORTED, "a lazy or possessive quantifier ('++')"),
    "^a??$": (UNSUPPORTED, "('??')"),
    "^{3}$": (INVALID, "a repetition with nothing to repeat"),
    "^a{2}{3}$": (INVALID, "a repetition with nothing to repeat"),
    "^a*{3}$": (INVALID, "a repetition with nothing to repeat"),
    "^a{,3}$": (INVALID, "a malformed repetition '{,3'"),
    "^a{x}$": (INVALID, "a malformed repetition '{x'"),
    "^a{3,x}$": (INVALID, "a malformed repetition '{3,x'"),
    "^a{3$": (INVALID, "a malformed repetition '{'"),
    "^a{34$": (INVALID, "a malformed repetition '{' (at"),
    "^{}$": (INVALID, "a malformed repetition"),
    "^a{3,2}$": (INVALID, "repeats {3,2}: the minimum is above the maximum"),
    "^a{2001}$": (INVALID, f"repeats up to 2001 times; at most {MAX_REPETITION}"),
    "^a{0,2001}$": (INVALID, "repeats up to 2001 times"),
}


@pytest.mark.parametrize("pattern", PATTERN_REFUSED)
def test_a_pattern_llama_cpp_cannot_honour_is_refused_saying_what(pattern: str) -> None:
    code, fragment = PATTERN_REFUSED[pattern]
    error = refusal({"type": "object", "properties": {"p": string(pattern)}})
    assert (error.status, error.code, error.param) == (400, code, WHERE), error.message
    assert fragment in error.message and "(at #/properties/p)" in error.message, error.message


# name -> (schema, code, fragments of the message)
REFUSED: dict[str, tuple[Any, str, list[str]]] = {
    # choices: enum values and anyOf/oneOf members, in all
    "1001 enum values": (enum_of(MAX_ALTERNATIVES + 1), TOO_COMPLEX, ["'enum' alternatives (at #)", "to 1001", "at most 1000"]),
    "enum and anyOf past the total": ({"anyOf": [enum_of(600), {"oneOf": [{"const": i} for i in range(400)]}]}, TOO_COMPLEX,
                                      ["'oneOf' alternatives (at #/anyOf/1)", "to 1002"]),
    # characters of names and values
    "one character past the literal bound": ({"const": "x" * (MAX_LITERAL_CHARS + 1)}, TOO_COMPLEX,
                                             [f"more than {MAX_LITERAL_CHARS} characters (at #)"]),
    "names and values past the literal bound together": ({"type": "object", "properties": {"ab": {"const": "x" * (MAX_LITERAL_CHARS - 1)}}},
                                                         TOO_COMPLEX, ["(at #/properties/ab)"]),
    "definition names count": ({"$defs": {"abc": {"const": "x" * (MAX_LITERAL_CHARS - 2)}}}, TOO_COMPLEX, ["characters"]),
    "a non-string const counts its JSON": ({"const": ["x" * (MAX_LITERAL_CHARS - 3)]}, TOO_COMPLEX, ["characters"]),
    "non-ASCII JSON counts characters": ({"const": ["é" * (MAX_LITERAL_CHARS - 3)]}, TOO_COMPLEX, ["characters"]),
    # optional properties
    "129 optional properties": (props(129, required=False), TOO_COMPLEX, ["the object at # has 129 optional", "at most 128"]),
    "130 properties, one required": ({**props(130, required=False), "required": ["p0"]}, TOO_COMPLEX, ["129 optional"]),
    # repetition counts
    "minLength 2001": ({"type": "string", "minLength": 2001}, INVALID, ["'minLength' is 2001; at most 2000"]),
    "maxItems 2001": ({"type": "array", "maxItems": 2001}, INVALID, ["'maxItems' is 2001"]),
    "minItems 2001": ({"type": "array", "minItems": 2001}, INVALID, ["'minItems' is 2001"]),
    "minLength -1": ({"type": "string", "minLength": -1}, INVALID, ["'minLength' must be a non-negative integer"]),
    "maxLength true": ({"type": "string", "maxLength": True}, INVALID, ["'maxLength' must be a non-negative integer"]),
    "minItems 1.5": ({"type": "array", "minItems": 1.5}, INVALID, ["'minItems' must be a non-negative integer"]),
    "minLength above maxLength": ({"type": "string", "minLength": 3, "maxLength": 2}, INVALID,
                                  ["'minLength' (3) is greater than 'maxLength' (2) (at #): no value can match"]),
    "minItems above maxItems": ({"type": "array", "minItems": 1, "maxItems": 0}, INVALID, ["'minItems' (1) is greater than 'maxItems' (0)"]),
    # the expansion estimate, nodes and depth
    "one element past the expansion": (expanding(1503), INVALID, [f"expands to more than {MAX_EXPANSION} grammar elements"]),
    "minLength counts towards the expansion": ({**expanding(1502), "properties": {**expanding(1502)["properties"],
                                                                                   "last": {"type": "string", "minLength": 1503}}},
                                               INVALID, ["expands"]),
    "an enum counts towards the expansion": ({**expanding(1501), "properties": {**expanding(1501)["properties"],
                                                                                 "e": enum_of(1)}}, INVALID, ["expands"]),
    "one subschema past the node bound": (props(MAX_SCHEMA_NODES), INVALID, [f"more than {MAX_SCHEMA_NODES} subschemas"]),
    "one level past the depth bound": (nested(MAX_SCHEMA_DEPTH + 1), INVALID, [f"nests deeper than {MAX_SCHEMA_DEPTH} levels", "/items" * 33]),
    # integer bounds
    "exclusive bounds leaving no integer": (integer(exclusiveMinimum=0, exclusiveMaximum=1), INVALID,
                                            ["'exclusiveMinimum' (0) and 'exclusiveMaximum' (1) leave no integer (at #)"]),
    "minimum above maximum": (integer(minimum=2, maximum=1), INVALID, ["'minimum' (2) and 'maximum' (1) leave no integer"]),
    "the tighter low bound is named": (integer(minimum=0, exclusiveMinimum=0, maximum=0), INVALID,
                                       ["'exclusiveMinimum' (0) and 'maximum' (0)"]),
    "the tighter high bound is named": (integer(minimum=5, maximum=5, exclusiveMaximum=5), INVALID,
                                        ["'minimum' (5) and 'exclusiveMaximum' (5)"]),
    "exclusive minimum at the maximum": (integer(exclusiveMinimum=5, maximum=5), INVALID, ["'exclusiveMinimum' (5) and 'maximum' (5)"]),
    "minimum at the exclusive maximum": (integer(minimum=5, exclusiveMaximum=5), INVALID, ["'minimum' (5) and 'exclusiveMaximum' (5)"]),
    "an integer bound past MAX_INTEGER": (integer(maximum=MAX_INTEGER + 1), UNSUPPORTED,
                                          ["'maximum' is supported only on 'type': 'integer' with integer bounds up to 1000000000000000"]),
    "an integer bound of 17 digits": (integer(maximum=10**16), UNSUPPORTED, ["'maximum' is supported only"]),
    "a negative integer bound past MAX_INTEGER": (integer(minimum=-MAX_INTEGER - 1), UNSUPPORTED, ["'minimum'"]),
    "a bound on a number": ({"type": "number", "minimum": 0}, UNSUPPORTED, ["'minimum' is supported only on 'type': 'integer'"]),
    "a bound with no type": ({"exclusiveMaximum": 3}, UNSUPPORTED, ["'exclusiveMaximum' is supported only"]),
    "a fractional bound": (integer(minimum=0, maximum=1.5), UNSUPPORTED, ["'minimum' is supported only"]),
    "a boolean bound": (integer(minimum=True), INVALID, ["'minimum' must be a number"]),
    "a string bound": (integer(maximum="3"), INVALID, ["'maximum' must be a number"]),
    # what the grammar cannot enforce
    "not": ({"not": {"type": "string"}}, UNSUPPORTED, ["'not' is not supported (at #)"]),
    "format email": ({"type": "string", "format": "email"}, UNSUPPORTED, ["'format' 'email' is not supported", "date, time, date-time, uuid"]),
    "pattern with minLength": ({"type": "string", "pattern": "^a$", "minLength": 1}, UNSUPPORTED,
                               ["'pattern' together with 'minLength' is not supported", "only 'pattern' would be enforced"]),
    "format with maxLength": ({"type": "string", "format": "date", "maxLength": 10}, UNSUPPORTED, ["'format' together with 'maxLength'"]),
    "type beside anyOf": ({"type": "string", "anyOf": [{"minLength": 1}]}, UNSUPPORTED, ["'type' beside 'anyOf'/'oneOf'"]),
    "type beside allOf": ({"type": "object", "allOf": [{"type": "object"}]}, UNSUPPORTED, ["'type' beside 'allOf'"]),
    "the first of two beside allOf is named": ({"type": "object", "properties": {}, "allOf": [{"type": "object"}]}, UNSUPPORTED,
                                               ["'properties' beside 'allOf'"]),
    "the first of two beside anyOf is named": ({"type": "object", "properties": {}, "anyOf": [{"type": "object"}]}, UNSUPPORTED,
                                               ["'properties' beside 'anyOf'/'oneOf'"]),
    "the first of two beside enum is named": ({"enum": ["a"], "pattern": "^a$", "maxLength": 1}, UNSUPPORTED,
                                              ["'maxLength' beside 'enum'/'const'"]),
    "an anyOf member's required is its own": ({"anyOf": [{"type": "object", "required": ["x"]}]}, INVALID,
                                              ["'required' names 'x'", "(at #/anyOf/0)"]),
    "allOf of strings": ({"allOf": [{"type": "string"}]}, UNSUPPORTED, ["'allOf' is supported only over object schemas", "#/allOf/0"]),
    "allOf of items": ({"allOf": [{"items": {}}]}, UNSUPPORTED, ["'allOf' is supported only"]),
    "minLength beside enum": ({"enum": ["a"], "minLength": 1}, UNSUPPORTED, ["'minLength' beside 'enum'/'const'"]),
    "pattern beside const": ({"const": "a", "pattern": "^a$"}, UNSUPPORTED, ["'pattern' beside 'enum'/'const'"]),
    "type beside $ref": ({"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a", "type": "string"}, UNSUPPORTED,
                         ["'type' beside '$ref'"]),
    "a remote $ref": ({"$ref": "https://example.com/s.json"}, UNSUPPORTED, ["must point inside the schema"]),
    "a $ref that is not a string": ({"$ref": 3}, UNSUPPORTED, ["must point inside the schema"]),
    "a $ref to the root": ({"type": "array", "items": {"$ref": "#/"}}, UNSUPPORTED, ["'#/' (the whole schema)", "(at #/items)"]),
    "a $ref with ~0": ({"$defs": {"a~b": {}}, "$ref": "#/$defs/a~0b"}, UNSUPPORTED, ["JSON-pointer escape"]),
    # not a schema
    "a $ref to nothing": ({"$ref": "#/$defs/missing"}, INVALID, ["'#/$defs/missing' points at nothing"]),
    "a $ref two past a list": ({"$defs": {"a": {"anyOf": [{}]}}, "$ref": "#/$defs/a/anyOf/2"}, INVALID, ["points at nothing"]),
    "a $ref past a list": ({"$defs": {"a": {"anyOf": [{}]}}, "$ref": "#/$defs/a/anyOf/1"}, INVALID, ["points at nothing"]),
    "a $ref into a list by name": ({"$defs": {"a": {"anyOf": [{}]}}, "$ref": "#/$defs/a/anyOf/x"}, INVALID, ["points at nothing"]),
    "a $ref to a value": ({"$defs": {"a": {"enum": ["x"]}}, "$ref": "#/$defs/a/enum/0"}, INVALID, ["does not point at a schema"]),
    "a type not known": ({"type": "str"}, INVALID, ["'type' must be one of string, number"]),
    "an empty type list": ({"type": []}, INVALID, ["'type' must be one of"]),
    "a repeated type": ({"type": ["string", "string"]}, INVALID, ["'type' must be one of"]),
    "an empty anyOf": ({"anyOf": []}, INVALID, ["'anyOf' must be a non-empty array of schemas"]),
    "a oneOf that is an object": ({"oneOf": {}}, INVALID, ["'oneOf' must be a non-empty array"]),
    "an empty enum": ({"enum": []}, INVALID, ["'enum' must be a non-empty array"]),
    "an enum that is a string": ({"enum": "ab"}, INVALID, ["'enum' must be a non-empty array"]),
    "properties as a list": ({"type": "object", "properties": []}, INVALID, ["'properties' must be an object of schemas"]),
    "a property that is not a schema": ({"type": "object", "properties": {"a": 3}}, INVALID,
                                        ["a schema must be an object (at #/properties/a); got int"]),
    "required as a string": ({"type": "object", "properties": {"a": {}}, "required": "a"}, INVALID, ["'required' must be an array"]),
    "required twice": ({"type": "object", "properties": {"a": {}}, "required": ["a", "a"]}, INVALID, ["distinct property names"]),
    "required of numbers": ({"type": "object", "properties": {"a": {}}, "required": [1]}, INVALID, ["distinct property names"]),
    "additionalProperties as a string": ({"type": "object", "additionalProperties": "no"}, INVALID,
                                         ["'additionalProperties' must be a boolean or a schema"]),
    "additionalProperties walked": ({"type": "object", "additionalProperties": {"not": {}}}, UNSUPPORTED,
                                    ["(at #/additionalProperties)"]),
    "items as a string": ({"type": "array", "items": "x"}, INVALID, ["'items' must be a schema"]),
    "tuple items walked": ({"type": "array", "items": [{}, {"not": {}}]}, UNSUPPORTED, ["(at #/items/1)"]),
    "prefixItems as an object": ({"type": "array", "prefixItems": {}}, INVALID, ["'prefixItems' must be an array of schemas"]),
    "prefixItems walked": ({"type": "array", "prefixItems": [{}, {"type": "str"}]}, INVALID, ["(at #/prefixItems/1)"]),
    "$defs as a list": ({"$defs": []}, INVALID, ["'$defs' must be an object of schemas"]),
    "definitions walked": ({"definitions": {"a": {"not": {}}}}, UNSUPPORTED, ["(at #/definitions/a)"]),
    "pattern as a number": ({"type": "string", "pattern": 3}, INVALID, ["'pattern' must be a string"]),
    # loops that come back before any character
    "a definition referring to itself": ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, INVALID,
                                         ["the schema at #/$defs/a", "refers back to itself"]),
    "a loop of three": ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/c"}]},
                                   "c": {"oneOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, INVALID, ["loop"]),
    "a loop reached from an allOf": ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "type": "array", "items": {"$ref": "#/$defs/a"}},
                                     INVALID, ["loop"]),
    "a loop behind a plain alternative": ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}}, "$ref": "#/$defs/a"},
                                          INVALID, ["loop"]),
    "a loop of two names both ends": ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}, INVALID,
                                      ["the schema at #/$defs/a (through #/$defs/b) refers back to itself"]),
    "required across allOf of a loop": ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]}, INVALID, ["loop"]),
}


@pytest.mark.parametrize("name", REFUSED)
def test_a_schema_past_a_bound_or_not_enforceable_is_refused_with_its_code_and_place(name: str) -> None:
    schema, code, fragments = REFUSED[name]
    error = refusal(schema)
    assert (error.status, error.code, error.param) == (400, code, WHERE), error.message
    what = "is too complex to enforce" if code == TOO_COMPLEX else "is not a schema the edge can enforce"
    assert error.message.startswith(f"'{WHERE}' {what}: ") and error.message.endswith("."), error.message
    for fragment in fragments:
        assert fragment in error.message, error.message


ACCEPTED: dict[str, Any] = {
    "1000 enum values": enum_of(MAX_ALTERNATIVES),
    "enum and anyOf at the total": {"anyOf": [enum_of(600), {"oneOf": [{"const": i} for i in range(398)]}]},
    "allOf members are not choices": {"allOf": [{"type": "object", "properties": {"a": enum_of(999)}}, {"type": "object"}]},
    "a literal of exactly the bound": {"const": "x" * MAX_LITERAL_CHARS},
    "names and values at the literal bound": {"type": "object", "properties": {"ab": {"const": "x" * (MAX_LITERAL_CHARS - 2)}}},
    "a non-string const at the literal bound": {"const": ["x" * (MAX_LITERAL_CHARS - 4)]},
    "non-ASCII JSON at the literal bound": {"const": ["é" * (MAX_LITERAL_CHARS - 4)]},  # characters, not \\u escapes
    "128 optional properties": props(128, required=False),
    "130 properties, two required": {**props(130, required=False), "required": ["p0", "p1"]},
    "lengths at the repetition bound": {"type": "string", "minLength": MAX_REPETITION, "maxLength": MAX_REPETITION},
    "items at the repetition bound": {"type": "array", "minItems": 0, "maxItems": MAX_REPETITION},
    "lengths of zero": {"type": "string", "minLength": 0, "maxLength": 0},
    "exactly the expansion": expanding(1502),
    "exactly the node bound": props(MAX_SCHEMA_NODES - 1),
    "exactly the depth bound": nested(MAX_SCHEMA_DEPTH),
    "exclusive bounds leaving one integer": integer(exclusiveMinimum=0, exclusiveMaximum=2),
    "minimum at maximum": integer(minimum=1, maximum=1),
    "exclusive minimum below the maximum": integer(exclusiveMinimum=4, maximum=5),
    "minimum below the exclusive maximum": integer(minimum=4, exclusiveMaximum=5),
    "a low bound only": integer(exclusiveMinimum=7),
    "integer bounds at MAX_INTEGER": integer(minimum=-MAX_INTEGER, maximum=MAX_INTEGER),
    "integer bounds of 16 digits": integer(minimum=-(10**15), maximum=10**15),  # llama.cpp's integer ranges: 16 decimals
    "a string with a known format": {"type": "string", "format": "date-time"},
    "minLength with maxLength": {"type": "string", "minLength": 1, "maxLength": 2},
    "a type list": {"type": ["string", "null"]},
    "type beside enum": {"type": "string", "enum": ["a", "b"]},
    "annotations beside anything": {"title": "t", "description": "d", "$ref": "#/$defs/a", "$defs": {"a": {"type": "string"}}},
    "a $ref into a list": {"$defs": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "$ref": "#/$defs/a/anyOf/1"},
    "allOf of objects and a $ref": {"$defs": {"b": {"type": "object", "properties": {"b": {}}, "required": ["b"]}},
                                    "allOf": [{"type": "object", "properties": {"a": {}}}, {"$ref": "#/$defs/b"},
                                              {"required": ["a"]}]},
    "a chain of references": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/c"}, "c": {"type": "string"}},
                              "$ref": "#/$defs/a"},
    "one definition reached twice": {"$defs": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
                                     "anyOf": [{"$ref": "#/$defs/a"}, {"oneOf": [{"$ref": "#/$defs/a"}, {"type": "integer"}]}]},
    "recursion through an array": {"$defs": {"list": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/list"}]}}},
                                   "$ref": "#/$defs/list"},
    "additionalProperties as a schema": {"type": "object", "additionalProperties": {"type": "integer"}},
    "tuples old and new": {"type": "array", "items": [{"type": "string"}], "prefixItems": [{"type": "integer"}]},
}


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_schema_within_every_bound_is_accepted(name: str) -> None:
    assert check_schema(ACCEPTED[name], WHERE) is None


def test_what_is_not_an_object_is_not_a_schema() -> None:
    for value in ([], "{}", None, 3):
        with pytest.raises(GatewayError) as refused:
            check_schema(value, "tools[0].function.parameters")
        assert (refused.value.code, refused.value.param) == ("invalid_type", "tools[0].function.parameters")
        assert refused.value.message == "'tools[0].function.parameters' must be a JSON schema object."


def test_the_schemas_of_one_request_share_the_choice_bound_with_its_tools() -> None:
    halves = [enum_of(500), {"anyOf": [{"const": i} for i in range(499)]}]
    check_together(halves, "tools", choices=1)
    with pytest.raises(GatewayError) as refused:
        check_together(halves, "tools", choices=2)
    assert (refused.value.code, refused.value.param) == (TOO_COMPLEX, "tools")
    assert "one grammar of 1001 choices" in refused.value.message


def test_the_schemas_of_one_request_share_the_literal_bound() -> None:
    half = MAX_LITERAL_CHARS // 2
    check_together([{"const": "x" * half}, {"const": "y" * half}], "tools")
    with pytest.raises(GatewayError) as refused:
        check_together([{"const": "x" * half}, {"const": "y" * (half + 1)}], "tools")
    assert (refused.value.code, refused.value.param) == (TOO_COMPLEX, "tools")
    assert f"reach {MAX_LITERAL_CHARS + 1} characters" in refused.value.message


LLAMA_PATTERNS = {"^\\\\$": False, "^a\\\\\\\\$": False, "^a|?$": True, "^a(*)$": True}  # pattern -> llama.cpp refuses it


@pytest.mark.parametrize("pattern", LLAMA_PATTERNS)
def test_the_pattern_check_agrees_with_llama_cpp_at_its_edges(tiny_runner: LlamaCppRunner, pattern: str) -> None:
    """An escaped backslash before the closing anchor is a character llama.cpp builds; a quantifier
    opening a group or an alternative repeats nothing, which llama.cpp refuses: so does the check."""
    body = {"messages": [{"role": "user", "content": "json"}], "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"schema": string(pattern)}}}
    try:
        result = tiny_runner.chat(body)
        llama_refuses = isinstance(result, dict) and "error" in result
    except ValueError:
        llama_refuses = True
    assert llama_refuses == LLAMA_PATTERNS[pattern]
    try:
        check_schema(string(pattern), WHERE)
        check_refuses = False
    except GatewayError:
        check_refuses = True
    assert check_refuses == llama_refuses


NESTINGS = {  # how a schema holds a subschema one level down
    "items": lambda inner: {"type": "array", "items": inner},
    "tuple items": lambda inner: {"type": "array", "items": [inner]},
    "prefixItems": lambda inner: {"type": "array", "prefixItems": [inner]},
    "properties": lambda inner: {"type": "object", "properties": {"p": inner}, "required": ["p"]},
    "additionalProperties": lambda inner: {"type": "object", "additionalProperties": inner},
    "$defs": lambda inner: {"$defs": {"d": inner}},
    "definitions": lambda inner: {"definitions": {"d": inner}},
    "anyOf": lambda inner: {"anyOf": [inner]},
    "oneOf": lambda inner: {"oneOf": [inner]},
    "allOf": lambda inner: {"allOf": [{"type": "object"}, inner]},
}


@pytest.mark.parametrize("nesting", NESTINGS)
def test_every_way_of_nesting_counts_one_level(nesting: str) -> None:
    def deep(levels: int) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "object"}
        for _ in range(levels):
            schema = NESTINGS[nesting](schema)
        return schema

    error = refusal(deep(MAX_SCHEMA_DEPTH + 1))
    assert (error.code, f"nests deeper than {MAX_SCHEMA_DEPTH} levels" in error.message) == (INVALID, True), error.message
    if nesting != "allOf":  # an allOf holding an allOf is refused for that, within the depth
        check_schema(deep(MAX_SCHEMA_DEPTH), WHERE)
