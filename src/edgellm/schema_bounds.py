"""JSON schemas checked before any grammar is built from them: valid, honourable, bounded.

A schema in `response_format`, a tool's `parameters` or Responses' `text.format` becomes a
llama.cpp grammar on the local edge (and is handed to Workers AI on Cloudflare). Unchecked, an
impossible schema (`minLength` 5 with `maxLength` 2: llama.cpp's repetition builder counts
`max - min` down through zero) grew the edge by ~330 MB/s until the kernel killed it; a keyword
the grammar builder does not know (`not`, a lookahead in a `pattern`, `format: email`) was
dropped with a log line while the answer was promised to match. So every schema is walked here
once, in bounded work, and refused with a 400 naming the keyword and where it is unless:

- it is a JSON Schema (each keyword of the right type, `$ref` pointing inside the document);
- every keyword is one llama.cpp's converter honours (`HONOURED`), or an annotation, in a
  combination it honours (a `pattern` wins over `minLength` there, so the pair is refused);
- it is bounded: at most MAX_SCHEMA_DEPTH nested schemas, MAX_SCHEMA_NODES of them, repetition
  counts up to MAX_REPETITION, and a total expansion estimate (nodes + repetitions + what each
  pattern unrolls to) up to MAX_EXPANSION. A depth bound also keeps storing a turn's
  `text.format` (a recursive copy and a JSON dump) far from Python's recursion limit;
- what the grammar costs to build and to sample under is bounded (`schema_too_complex`): the
  alternatives it chooses between (`enum` values and `anyOf`/`oneOf` members, MAX_ALTERNATIVES
  in all), the text of its literals (MAX_LITERAL_CHARS) and the optional properties of an object
  (MAX_OPTIONAL_PROPERTIES). Measured on this edge's llama.cpp, before any generation: a
  20,000-value enum took 12 s of one core to its first token on a 64-token vocabulary (a slot held
  past its answer's deadline on a real one, where every token costs more), an object of 1,000
  optional properties 7 s (llama.cpp writes a rule per suffix of them); at the bounds, ~0.1 s each.
  The grammar is built inside one native call that nothing can interrupt, so only this bound keeps
  it short. The first two figures are OpenAI's own Structured Outputs limits, so a schema written
  for OpenAI fits;
- llama.cpp can build it: every `required` name is a property the grammar can write (its builder
  ignores the others, and the answer would break the schema), no `$ref` to the root or with a
  JSON-pointer escape (llama.cpp resolves neither), no loop of `$ref`/`anyOf` that comes back to
  itself before any character (a left-recursive grammar, which llama.cpp refuses).

Pure and core: the same check runs on Cloudflare, where it costs microseconds per schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .errors import invalid

MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_NODES = 2000
# minLength / maxLength / minItems / maxItems, and {m,n} in a pattern: llama.cpp's grammar parser
# refuses a count over 2000 ("number of repetitions exceeds sane defaults", writing the whole
# grammar, the caller's enum values and all, to stderr)
MAX_REPETITION = 2000
MAX_EXPANSION = 65536
MAX_PATTERN_CHARS = 4096
MAX_ALTERNATIVES = 1000  # enum values and anyOf/oneOf members, in all (OpenAI's bound on enum values)
MAX_LITERAL_CHARS = 120_000  # property and definition names, enum and const values (OpenAI's bound)
MAX_OPTIONAL_PROPERTIES = 128  # per object: llama.cpp's rules for them grow with the cube of their count
MAX_INTEGER = 10**15  # llama.cpp builds integer ranges digit by digit, within 16 decimals

TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
FORMATS = ("date", "time", "date-time", "uuid")  # the string formats llama.cpp's grammar builder knows
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                         "readOnly", "writeOnly", "$defs", "definitions", "strict", "nullable"})
HONOURED = frozenset({"type", "$ref", "anyOf", "oneOf", "allOf", "const", "enum", "properties", "required",
                      "additionalProperties", "items", "prefixItems", "minItems", "maxItems", "pattern", "format",
                      "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_LENGTHS = ("minLength", "maxLength", "minItems", "maxItems")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_REGEX_SPECIAL = set("^$.|?*+()[]{}\\/-")
_ESCAPES = set("nrt") | _REGEX_SPECIAL  # what the grammar's character escapes can say; \d, \w, \p{..}, \1 cannot


class _Refused(Exception):
    def __init__(self, message: str, code: str = "invalid_schema") -> None:
        super().__init__(message)
        self.message, self.code = message, code


def _unsupported(message: str) -> _Refused:
    return _Refused(message, "unsupported_schema")


def _too_complex(message: str) -> _Refused:
    return _Refused(message, "schema_too_complex")


def _literal_chars(value: Any) -> int:
    return len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False, default=str))


@dataclass
class _Walk:
    root: dict[str, Any]
    nodes: int = 0
    expansion: int = 0
    alternatives: int = 0
    literal_chars: int = 0
    # members of an `allOf` (their `required` may name a sibling's property: llama.cpp merges them)
    merged: set[int] = field(default_factory=set)
    # every schema that leads elsewhere before any character is written ($ref, anyOf, oneOf,
    # allOf), by id, with where it is: the places a grammar's rules could loop (no_loops)
    leads: dict[int, tuple[dict[str, Any], str]] = field(default_factory=dict)

    def choose(self, count: int, keyword: str, at: str) -> None:
        self.alternatives += count
        if self.alternatives > MAX_ALTERNATIVES:
            raise _too_complex(f"its '{keyword}' alternatives (at {at}) bring the schema's choices ('enum' values and "
                               f"'anyOf'/'oneOf' members) to {self.alternatives}; at most {MAX_ALTERNATIVES} in all are supported")

    def literal(self, value: Any, at: str) -> None:
        self.literal_chars += _literal_chars(value)
        if self.literal_chars > MAX_LITERAL_CHARS:
            raise _too_complex(f"its names and 'enum'/'const' values reach more than {MAX_LITERAL_CHARS} characters (at {at}); "
                               "make them fewer or shorter")

    def grow(self, amount: int) -> None:
        self.expansion += amount
        if self.expansion > MAX_EXPANSION:
            raise _Refused(f"the schema expands to more than {MAX_EXPANSION} grammar elements (repetition counts, "
                           f"patterns and subschemas together); make it smaller")

    def schema(self, node: Any, at: str, depth: int) -> None:
        if depth > MAX_SCHEMA_DEPTH:
            raise _Refused(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (at {at})")
        self.nodes += 1
        if self.nodes > MAX_SCHEMA_NODES:
            raise _Refused(f"the schema has more than {MAX_SCHEMA_NODES} subschemas")
        self.grow(1)
        if not isinstance(node, dict):
            raise _Refused(f"a schema must be an object (at {at}); got {type(node).__name__}")
        for key in node:
            if key not in HONOURED and key not in ANNOTATIONS:
                raise _unsupported(f"'{key}' is not supported (at {at}): the grammar the answer is generated under cannot enforce it")
        for key in ("$defs", "definitions"):
            if key in node:
                defs = node[key]
                if not isinstance(defs, dict):
                    raise _Refused(f"'{key}' must be an object of schemas (at {at})")
                for name, sub in defs.items():
                    self.literal(name, at)
                    self.schema(sub, f"{at}/{key}/{name}", depth + 1)
        if "$ref" in node:
            self.ref(node, at)
        self.type_of(node, at)
        self.combinators(node, at, depth)
        self.values(node, at)
        self.object(node, at, depth)
        self.array(node, at, depth)
        self.string(node, at)
        self.number(node, at)

    def ref(self, node: dict[str, Any], at: str) -> None:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise _unsupported(f"'$ref' must point inside the schema ('#/...') (at {at}); remote references are not fetched")
        if not ref.strip("#/"):
            raise _unsupported(f"'$ref' {ref!r} (the whole schema) is not supported (at {at}): llama.cpp's grammar builder refuses "
                               "a reference to the root; put the schema under '$defs' and refer to it there")
        if "~" in ref:
            raise _unsupported(f"'$ref' {ref[:200]!r} uses a JSON-pointer escape ('~0' or '~1') (at {at}), which llama.cpp's "
                               "grammar builder does not decode; name the definition without '/' or '~'")
        self.leads[id(node)] = (node, at)
        target = self.resolve(ref, at)
        if not isinstance(target, dict):
            raise _Refused(f"'$ref' {ref[:200]!r} does not point at a schema (at {at})")
        others = set(node) - ANNOTATIONS - {"$ref"}
        if others:
            raise _unsupported(f"'{sorted(others)[0]}' beside '$ref' is not supported (at {at}): the reference replaces it")

    def type_of(self, node: dict[str, Any], at: str) -> None:
        if "type" not in node:
            return
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if not kinds or any(k not in TYPES for k in kinds) or len(set(map(str, kinds))) != len(kinds):
            raise _Refused(f"'type' must be one of {', '.join(TYPES)} or a list of them (at {at})")

    def combinators(self, node: dict[str, Any], at: str, depth: int) -> None:
        for key in ("anyOf", "oneOf", "allOf"):
            if key not in node:
                continue
            members = node[key]
            if not isinstance(members, list) or not members:
                raise _Refused(f"'{key}' must be a non-empty array of schemas (at {at})")
            self.leads[id(node)] = (node, at)
            if key != "allOf":
                self.choose(len(members), key, at)
            for i, member in enumerate(members):
                if key == "allOf" and isinstance(member, dict):
                    self.merged.add(id(member))
                self.schema(member, f"{at}/{key}/{i}", depth + 1)
                if key == "allOf":  # llama.cpp merges the members' properties and required, nothing else
                    extra = set(member) - ANNOTATIONS - {"type", "properties", "required", "$ref"}
                    if extra or member.get("type", "object") != "object":
                        raise _unsupported(f"'allOf' is supported only over object schemas of 'properties' and 'required' "
                                           f"(at {at}/allOf/{i})")
        if "allOf" in node:
            self.merged_required(node["allOf"], f"{at}/allOf")
        if "allOf" in node and set(node) - ANNOTATIONS - {"allOf"}:
            raise _unsupported(f"'{sorted(set(node) - ANNOTATIONS - {'allOf'})[0]}' beside 'allOf' is not supported (at {at})")
        if ("anyOf" in node or "oneOf" in node) and set(node) - ANNOTATIONS - {"anyOf", "oneOf"}:
            raise _unsupported(f"'{sorted(set(node) - ANNOTATIONS - {'anyOf', 'oneOf'})[0]}' beside 'anyOf'/'oneOf' is not "
                               f"supported (at {at}): put it in each alternative")

    def values(self, node: dict[str, Any], at: str) -> None:
        if "enum" in node:
            if not isinstance(node["enum"], list) or not node["enum"]:
                raise _Refused(f"'enum' must be a non-empty array (at {at})")
            self.grow(len(node["enum"]))
            self.choose(len(node["enum"]), "enum", at)
            for value in node["enum"]:
                self.literal(value, at)
        if "const" in node:
            self.literal(node["const"], at)
        if ("enum" in node or "const" in node) and set(node) - ANNOTATIONS - {"enum", "const", "type"}:
            raise _unsupported(f"'{sorted(set(node) - ANNOTATIONS - {'enum', 'const', 'type'})[0]}' beside 'enum'/'const' "
                               f"is not supported (at {at})")

    def object(self, node: dict[str, Any], at: str, depth: int) -> None:
        properties = node.get("properties", {})
        if not isinstance(properties, dict):
            raise _Refused(f"'properties' must be an object of schemas (at {at})")
        for name, sub in properties.items():
            self.literal(name, at)
            self.schema(sub, f"{at}/properties/{name}", depth + 1)
        required = node.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required) or len(set(required)) != len(required):
            raise _Refused(f"'required' must be an array of distinct property names (at {at})")
        if id(node) not in self.merged:  # an allOf member's are checked against the merge (merged_required)
            self.required(required, properties, at)
        optional = len(set(properties) - set(required))
        if optional > MAX_OPTIONAL_PROPERTIES:
            raise _too_complex(f"the object at {at} has {optional} optional properties; at most {MAX_OPTIONAL_PROPERTIES} are "
                               "supported (list more of them in 'required', or split the object)")
        extra = node.get("additionalProperties", True)
        if isinstance(extra, dict):
            self.schema(extra, f"{at}/additionalProperties", depth + 1)
        elif not isinstance(extra, bool):
            raise _Refused(f"'additionalProperties' must be a boolean or a schema (at {at})")

    @staticmethod
    def required(required: list[str], properties: dict[str, Any], at: str) -> None:
        """Every required name must be a property: llama.cpp's grammar builder writes only the
        listed properties as required (and any others only where `additionalProperties` allows,
        optionally), so a required name that is not one would never be written, or only by
        chance, and the answer would break the schema it was promised to match."""
        for name in required:
            if name not in properties:
                raise _Refused(f"'required' names {name[:100]!r}, which is not in 'properties' (at {at}): the grammar could "
                               "never require it, so the answer would not match the schema; add it to 'properties'")

    def merged_required(self, members: list[Any], at: str) -> None:
        """An `allOf` is one object to llama.cpp (the members' properties and required merged,
        a `$ref` member resolved): its required names are checked against the merge."""
        properties: dict[str, Any] = {}
        required: list[str] = []
        for member in members:
            seen: set[int] = set()
            while isinstance(member, dict) and "$ref" in member and id(member) not in seen:  # a loop: no_loops refuses it
                seen.add(id(member))
                member = self.resolve(member["$ref"], at)
            if isinstance(member, dict):
                properties.update(member.get("properties") or {})
                required += [r for r in member.get("required") or [] if isinstance(r, str)]
        self.required(required, properties, at)

    def resolve(self, ref: str, at: str) -> Any:
        target: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise _Refused(f"'$ref' {ref[:200]!r} points at nothing in the schema (at {at})")
        return target

    def no_loops(self) -> None:
        """Refuse a loop of `$ref`/`anyOf`/`oneOf`/`allOf` that comes back to where it started
        before any character is written (`a` refers to `b`, `b` to `a`): a left-recursive grammar,
        which llama.cpp refuses (or recurses into). Recursion through an object or an array is
        fine: its bracket is written first. Each schema is visited once: bounded by the nodes."""
        done: set[int] = set()

        def nexts(node: dict[str, Any], at: str) -> list[Any]:
            led = [self.resolve(node["$ref"], at)] if "$ref" in node else []
            return led + [m for key in ("anyOf", "oneOf", "allOf") for m in node.get(key) or [] if isinstance(m, dict)]

        for start, at in list(self.leads.values()):
            if id(start) in done:
                continue
            # depth first, with a stack rather than recursion: a chain of 2000 references stays
            # far from Python's recursion limit (lower still on Pyodide)
            on_path: set[int] = {id(start)}
            stack: list[tuple[dict[str, Any], str, list[Any]]] = [(start, at, nexts(start, at))]
            while stack:
                node, where, todo = stack[-1]
                if not todo:
                    stack.pop()
                    on_path.discard(id(node))
                    done.add(id(node))
                    continue
                sub = todo.pop()
                if id(sub) in on_path:  # named where the loop starts and where it closes
                    raise _Refused(f"the schema at {self.leads[id(sub)][1]} (through {where}) refers back to itself before any value is written (a loop of '$ref', "
                                   "'anyOf', 'oneOf' or 'allOf'): no grammar can be built from it")
                if id(sub) in done or id(sub) not in self.leads:
                    continue
                sub_at = self.leads[id(sub)][1]
                on_path.add(id(sub))
                stack.append((sub, sub_at, nexts(sub, sub_at)))

    def array(self, node: dict[str, Any], at: str, depth: int) -> None:
        items = node.get("items")
        if isinstance(items, dict):
            self.schema(items, f"{at}/items", depth + 1)
        elif isinstance(items, list):  # draft-07 tuples
            for i, sub in enumerate(items):
                self.schema(sub, f"{at}/items/{i}", depth + 1)
        elif items is not None:
            raise _Refused(f"'items' must be a schema (at {at})")
        if "prefixItems" in node:
            if not isinstance(node["prefixItems"], list):
                raise _Refused(f"'prefixItems' must be an array of schemas (at {at})")
            for i, sub in enumerate(node["prefixItems"]):
                self.schema(sub, f"{at}/prefixItems/{i}", depth + 1)
        self.lengths(node, at, "minItems", "maxItems")

    def lengths(self, node: dict[str, Any], at: str, low: str, high: str) -> None:
        for key in (low, high):
            value = node.get(key)
            if key in node and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise _Refused(f"'{key}' must be a non-negative integer (at {at})")
            if key in node and value > MAX_REPETITION:
                raise _Refused(f"'{key}' is {value}; at most {MAX_REPETITION} is supported (at {at})")
        if low in node and high in node and node[low] > node[high]:
            raise _Refused(f"'{low}' ({node[low]}) is greater than '{high}' ({node[high]}) (at {at}): no value can match")
        self.grow(max(node.get(low, 0), node.get(high, 0)))

    def string(self, node: dict[str, Any], at: str) -> None:
        self.lengths(node, at, "minLength", "maxLength")
        if "format" in node:
            if node["format"] not in FORMATS:
                raise _unsupported(f"'format' {str(node['format'])[:64]!r} is not supported (at {at}); supported: {', '.join(FORMATS)}")
        if "pattern" in node:
            pattern = node["pattern"]
            if not isinstance(pattern, str):
                raise _Refused(f"'pattern' must be a string (at {at})")
            self.grow(pattern_size(pattern, at))
        used = [k for k in ("pattern", "format", "minLength", "maxLength") if k in node]
        if len(used) > 1 and used[0] in ("pattern", "format"):
            raise _unsupported(f"'{used[0]}' together with '{used[1]}' is not supported (at {at}): only '{used[0]}' would be enforced")

    def number(self, node: dict[str, Any], at: str) -> None:
        bounds = {k: node[k] for k in _BOUNDS if k in node}
        if not bounds:
            return
        for key, value in bounds.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise _Refused(f"'{key}' must be a number (at {at})")
        if node.get("type") != "integer" or any(not isinstance(v, int) or abs(v) > MAX_INTEGER for v in bounds.values()):
            raise _unsupported(f"'{next(iter(bounds))}' is supported only on 'type': 'integer' with integer bounds up to "
                               f"{MAX_INTEGER} (at {at}): the grammar cannot bound other numbers")
        lows = [(bounds[k] + (k == "exclusiveMinimum"), k) for k in ("minimum", "exclusiveMinimum") if k in bounds]
        highs = [(bounds[k] - (k == "exclusiveMaximum"), k) for k in ("maximum", "exclusiveMaximum") if k in bounds]
        if lows and highs and max(lows)[0] > min(highs)[0]:
            (low, low_key), (high, high_key) = max(lows), min(highs)
            raise _Refused(f"'{low_key}' ({bounds[low_key]}) and '{high_key}' ({bounds[high_key]}) leave no integer (at {at})")


def pattern_size(pattern: str, at: str = "#") -> int:
    """How many grammar elements a `pattern` unrolls to, refusing what llama.cpp's regex
    converter cannot honour: no anchors at both ends, lookarounds and other `(?` groups,
    backreferences and class escapes (`\\d`, `\\p{L}`, ...), unbalanced groups or classes,
    repetition counts out of order or over MAX_REPETITION."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise _Refused(f"'pattern' is longer than {MAX_PATTERN_CHARS} characters (at {at})")
    escaped_end = (len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))) % 2  # '\\$' is a character, '\\\\$' an anchor
    if not (pattern.startswith("^") and pattern.endswith("$")) or escaped_end:
        raise _unsupported(f"'pattern' must start with '^' and end with '$' (at {at}): llama.cpp's grammar needs it anchored")
    body, i = pattern[1:-1], 0
    stack: list[list[int]] = [[0, 0]]  # per open group: [size of the alternatives so far, size of the current sequence]
    last = 0  # size of the last atom (what a quantifier repeats)

    def refuse(what: str) -> _Refused:
        return _unsupported(f"'pattern' uses {what}, which llama.cpp's grammar cannot honour (at {at})")

    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 >= len(body):
                raise _Refused(f"'pattern' ends with a lone backslash (at {at})")
            if body[i + 1] not in _ESCAPES:
                raise refuse(f"the escape '\\{body[i + 1]}' (write a class such as [0-9] instead)")
            last, i = 1, i + 2
        elif c == "[":
            j = i + 1
            if j < len(body) and body[j] == "^":
                j += 1
            if j < len(body) and body[j] == "]":
                j += 1
            while j < len(body) and body[j] != "]":
                if body[j] == "\\":
                    if j + 1 >= len(body) or body[j + 1] not in _ESCAPES:
                        raise refuse(f"the escape '\\{body[j + 1] if j + 1 < len(body) else ''}' in a class")
                    j += 1
                elif body[j] == "[":
                    raise refuse("a nested or POSIX class ('[' inside '[...]')")
                j += 1
            if j >= len(body):
                raise _Refused(f"'pattern' has a '[' without its ']' (at {at})")
            last, i = 1, j + 1
        elif c == "(":
            if body.startswith("(?", i):
                raise refuse("a '(?' group (lookahead, lookbehind, named or non-capturing groups)")
            stack.append([0, 0])
            last, i = 0, i + 1  # a quantifier right after '(' or '|' repeats nothing: llama.cpp refuses it
            continue
        elif c == ")":
            if len(stack) == 1:
                raise _Refused(f"'pattern' has a ')' without its '(' (at {at})")
            alternatives, sequence = stack.pop()
            last, i = alternatives + sequence, i + 1
        elif c == "|":
            stack[-1][0] += stack[-1][1]
            stack[-1][1] = 0
            last, i = 0, i + 1
            continue
        elif c in "*+?":
            if not last:
                raise _Refused(f"'pattern' has a '{c}' with nothing to repeat (at {at})")
            i += 1
            if i < len(body) and body[i] in "?+":
                raise refuse(f"a lazy or possessive quantifier ('{c}{body[i]}')")
            last = 0
            continue
        elif c == "{":
            end = body.find("}", i)
            spec = body[i + 1:end] if end > 0 else ""
            low, _, high = spec.partition(",")
            if end < 0 or not low.isdigit() or (high and not high.isdigit()):
                raise _Refused(f"'pattern' has a malformed repetition '{{{spec}' (at {at}); write {{m}}, {{m,}} or {{m,n}}")
            if not last:
                raise _Refused(f"'pattern' has a repetition with nothing to repeat (at {at})")
            m, n = int(low), int(high) if high else int(low)
            if m > n:
                raise _Refused(f"'pattern' repeats {{{m},{n}}}: the minimum is above the maximum (at {at})")
            if n > MAX_REPETITION:
                raise _Refused(f"'pattern' repeats up to {n} times; at most {MAX_REPETITION} is supported (at {at})")
            stack[-1][1] += last * (max(n, 1) - 1)  # the atom itself was counted once already
            if stack[-1][1] > MAX_EXPANSION:
                raise _Refused(f"'pattern' unrolls to more than {MAX_EXPANSION} grammar elements (at {at})")
            last, i = 0, end + 1
            continue
        else:
            last, i = 1, i + 1
        stack[-1][1] += last
    if len(stack) != 1:
        raise _Refused(f"'pattern' has a '(' without its ')' (at {at})")
    return stack[0][0] + stack[0][1]


def check_schema(schema: Any, where: str) -> None:
    """Raise the 400 (`invalid_schema` or `unsupported_schema`, naming the keyword, its place
    and the request field `where`) unless `schema` is valid, honourable and bounded."""
    if not isinstance(schema, dict):
        raise invalid(f"'{where}' must be a JSON schema object.", where, "invalid_type")
    try:
        walk = _Walk(schema)
        walk.schema(schema, "#", 0)
        walk.no_loops()
    except _Refused as exc:
        what = "is too complex to enforce" if exc.code == "schema_too_complex" else "is not a schema the edge can enforce"
        raise invalid(f"'{where}' {what}: {exc.message}.", where, exc.code) from None
    except RecursionError:  # unreachable within MAX_SCHEMA_DEPTH; kept so a schema can never be a 500
        raise invalid(f"'{where}' nests too deeply.", where, "invalid_schema") from None


def check_together(schemas: list[Any], where: str, choices: int = 0) -> None:
    """The cost bounds over every schema of one request together: its tools' `parameters` and its
    `response_format` become one grammar (the tool-call envelope chooses between the tools, one
    more choice each, `choices`), so what each may cost alone is not what they cost at once.
    Each schema was checked alone first (`check_schema`)."""
    alternatives, chars = choices, 0
    try:
        for schema in schemas:
            walk = _Walk(schema)
            walk.schema(schema, "#", 0)
            alternatives, chars = alternatives + walk.alternatives, chars + walk.literal_chars
    except _Refused as exc:  # unreachable after check_schema; kept so a schema can never be a 500
        raise invalid(f"'{where}' is not a schema the edge can enforce: {exc.message}.", where, exc.code) from None
    if alternatives > MAX_ALTERNATIVES:
        raise invalid(f"'{where}' together are too complex to enforce: their schemas make one grammar of {alternatives} choices "
                      f"('enum' values, 'anyOf'/'oneOf' members and the tools themselves); at most {MAX_ALTERNATIVES} are supported.",
                      where, "schema_too_complex")
    if chars > MAX_LITERAL_CHARS:
        raise invalid(f"'{where}' together are too complex to enforce: their schemas' names and 'enum'/'const' values reach "
                      f"{chars} characters; at most {MAX_LITERAL_CHARS} are supported.", where, "schema_too_complex")
