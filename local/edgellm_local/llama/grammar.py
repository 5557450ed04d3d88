"""Structured outputs, tool calls and logprobs on llama.cpp, for any chat GGUF.

JSON mode and JSON schemas are llama.cpp's own grammar-constrained generation
(`response_format`). Tool calls use llama.cpp's "generic" tool-call format, done here rather
than by the runner's chat template (which only handles tools for templates that know them):
the tools are described in a system message and the answer is constrained by a JSON schema to
either `{"tool_calls": [{"name": <one of the tools>, "arguments": <its parameters>}]}` or (with
`tool_choice: "auto"`) `{"response": "<text>"}`, so even a model that has never seen a tool
answers with a valid call. The previous turns of a tool conversation are written back as
plain text any chat template can render ("Called get_weather with {...}." and "get_weather
returned: ..."): written back as the JSON envelope, a small model copies it and calls the tool
again instead of answering.

After tool results (the last message is a `role: "tool"` turn) under `tool_choice: "auto"`, the
answer path comes first: the model writes plain text (or the `response_format` it was given),
unconstrained, and only a reply that is the call envelope is read as a further call. Forced
choices stay grammar-constrained calls.

The envelope is this module's own wire format and never reaches a client: a complete one becomes
`tool_calls` or text, and one cut by `max_tokens` becomes a partial call (arguments as far as
generated, as OpenAI returns a cut call) or the answer text as far as generated.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping

TOOLS_PROMPT = (
    "You can call these tools (JSON Schema of each one's arguments):\n{tools}\n"
    'Answer with one JSON object: {{"tool_calls": [{{"name": "<tool name>", "arguments": {{...}}}}]}} to call tools'
    "{or_answer}."
)
AFTER_RESULTS_PROMPT = (
    "You can call these tools (JSON Schema of each one's arguments):\n{tools}\n"
    "The results of the tools called so far are in the conversation. If they answer the question, "
    "answer the user in plain text. Only if another tool is needed, answer with just the JSON object "
    '{{"tool_calls": [{{"name": "<tool name>", "arguments": {{...}}}}]}}.'
)


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools become a prompt and a grammar, and its answer tool calls."""

    tools: list[dict[str, Any]]
    choice: Any = None  # None (auto) | "required" | {"type": "function", "function": {"name"}}
    parallel: bool = True
    response_schema: dict[str, Any] | None = None  # a response_format schema the text answer must meet
    after_results: bool = False  # the conversation ends with tool results: the answer path comes first
    functions: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "functions", [t["function"] for t in self.tools])

    @property
    def must_call(self) -> bool:
        return self.choice is not None

    @property
    def free_answer(self) -> bool:
        """Tool results are in and no call is forced: the model answers unconstrained (a call is
        still read back if that is what it wrote)."""
        return self.after_results and not self.must_call

    def _callable(self) -> list[dict[str, Any]]:
        if isinstance(self.choice, dict):
            name = self.choice["function"]["name"]
            return [f for f in self.functions if f["name"] == name]
        return self.functions

    def schema(self) -> dict[str, Any]:
        calls = [{"type": "object",
                  "properties": {"name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}},
                  "required": ["name", "arguments"], "additionalProperties": False}
                 for f in self._callable()]
        items = calls[0] if len(calls) == 1 else {"anyOf": calls}
        array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
        if not self.parallel:
            array["maxItems"] = 1
        call = {"type": "object", "properties": {"tool_calls": array}, "required": ["tool_calls"], "additionalProperties": False}
        if self.must_call:
            return call
        answer = {"type": "object", "properties": {"response": self.response_schema or {"type": "string"}},
                  "required": ["response"], "additionalProperties": False}
        return {"anyOf": [call, answer]}

    def system_prompt(self) -> str:
        tools = "\n".join(json.dumps({"name": f["name"], "description": f.get("description", ""),
                                      "parameters": f.get("parameters") or {}}, ensure_ascii=False) for f in self._callable())
        if self.free_answer:
            return AFTER_RESULTS_PROMPT.format(tools=tools)
        or_answer = "" if self.must_call else ', or {"response": "<your answer>"} to answer directly'
        return TOOLS_PROMPT.format(tools=tools, or_answer=or_answer)

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The model's answer -> (text, []) or (None, OpenAI tool calls); never the envelope itself.

        A complete envelope is read as JSON. One cut by max_tokens mid-JSON is read as far as it
        goes: a partial call (its arguments as generated; its name completed from the one tool
        the grammar's prefix allows) or the `response` text so far."""
        if self.free_answer and (self.response_schema is not None or not text.lstrip().startswith("{")):
            return text, []  # a plain answer (or the response_format's JSON): no envelope to read
        text = _unfenced(text)
        try:
            data = json.loads(text)
        except ValueError:
            return self._parse_cut(text)
        if isinstance(data, dict) and isinstance(data.get("tool_calls"), list):
            return None, [{"id": f"call_{secrets.token_hex(12)}", "type": "function",
                           "function": {"name": c.get("name"), "arguments": json.dumps(c.get("arguments"), ensure_ascii=False)}}
                          for c in data["tool_calls"] if isinstance(c, dict)]
        if isinstance(data, dict) and set(data) == {"response"}:
            response = data["response"]
            return (response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)), []
        return text, []

    def _parse_cut(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        body = text.lstrip()
        if self.free_answer and not _could_be_envelope(body):
            return text, []  # free text that happens to start with "{"
        scanner = ToolCallStream()
        fragments = scanner.feed(body)
        if scanner.started:
            calls: dict[int, dict[str, Any]] = {}
            for f in fragments:
                call = calls.setdefault(f["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = f.get("id") or call["id"]
                call["function"]["name"] = f["function"].get("name") or call["function"]["name"]
                call["function"]["arguments"] += f["function"].get("arguments", "")
            return None, [calls[i] for i in sorted(calls)]
        squeezed = re.sub(r"\s+", "", body[:40])
        if squeezed.startswith('{"tool_calls"') or (len(squeezed) > 2 and '{"tool_calls"'.startswith(squeezed)):
            return None, [self._unnamed_call(body)]
        response = re.match(r'\s*\{\s*"response"\s*:\s*', body)
        if response:
            return _partial_value(body[response.end():]), []
        return "", []  # too short to say which it was: nothing of the envelope is passed on

    def _unnamed_call(self, body: str) -> dict[str, Any]:
        """A call cut before its name was complete: the grammar allows only names of these tools,
        so the prefix written picks one (the first tool when none was written)."""
        prefix = re.search(r'"name"\s*:\s*"([^"]*)$', body)
        names = [f["name"] for f in self._callable()]
        name = next((n for n in names if prefix and n.startswith(prefix.group(1))), names[0])
        return {"id": f"call_{secrets.token_hex(12)}", "type": "function", "function": {"name": name, "arguments": ""}}


def _unfenced(text: str) -> str:
    """The envelope without a Markdown code fence around it (llama.cpp may return a cut
    constrained answer as ```` ```json ```` ... )."""
    body = text.strip()
    if body.startswith("```"):
        body = body[3:].removeprefix("json").strip()
        body = body.removesuffix("```").rstrip()
    return body


def _could_be_envelope(body: str) -> bool:
    squeezed = re.sub(r"\s+", "", body[:40])
    return any(squeezed.startswith(k) or k.startswith(squeezed) for k in ('{"tool_calls"', '{"response"'))


def _partial_value(rest: str) -> str:
    """A JSON value cut short: a string's text decoded as far as it goes; anything else (an
    object of a response_format schema) as the JSON text written so far."""
    if not rest.startswith('"'):
        return rest
    for end in range(len(rest), 0, -1):  # drop a trailing half escape (`\`, `\u00`)
        try:
            return json.loads(rest[:end] + '"')
        except ValueError:
            continue
    return ""


def _json_arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def history(messages: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A tool conversation's turns as plain text any chat template renders: a call is what the
    assistant said it did ("Called get_weather with {...}."), a result a user turn saying what
    the tool returned. (As JSON envelopes, a small model copies the call instead of answering.)"""
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out = []
    for m in messages:
        if m.get("tool_calls"):
            said = [m["content"]] if m.get("content") else []
            said += [f"Called {c['function']['name']} with {c['function']['arguments']}." for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(said)})
        elif m.get("role") == "tool":
            name = names.get(m.get("tool_call_id")) or "The tool"
            out.append({"role": "user", "content": f"{name} returned: {m['content']}"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def with_system(messages: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + prompt}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def response_format(value: Mapping[str, Any]) -> dict[str, Any]:
    """Workers AI's `response_format` -> llama.cpp's (its server's OpenAI shape)."""
    if value.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"schema": value.get("json_schema") or {}}}
    return {"type": "json_object"}


def apply(inputs: Mapping[str, Any], body: dict[str, Any]) -> ToolPlan | None:
    """Rewrite a llama.cpp chat body for the inputs' structured outputs, tools and logprobs;
    the tool plan when the answer must be parsed back into tool calls."""
    plan = None
    messages = body.get("messages")
    after_results = bool(messages) and messages[-1].get("role") == "tool"
    if messages is not None and any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        body["messages"] = messages = history(messages)
    fmt = inputs.get("response_format")
    if inputs.get("tools"):
        schema = fmt.get("json_schema") if fmt and fmt.get("type") == "json_schema" else None
        plan = ToolPlan(list(inputs["tools"]), inputs.get("tool_choice"), inputs.get("parallel_tool_calls", True) is not False, schema,
                        after_results)
        body["messages"] = with_system(list(messages or []), plan.system_prompt())
        if not plan.free_answer:
            body["response_format"] = {"type": "json_schema", "json_schema": {"schema": plan.schema()}}
        elif fmt:
            body["response_format"] = response_format(fmt)
    elif fmt:
        body["response_format"] = response_format(fmt)
    if inputs.get("logprobs"):
        body["logprobs"] = True
        body["top_logprobs"] = max(1, int(inputs.get("top_logprobs") or 0))  # llama.cpp gives none for 0
    return plan


def logprobs_of(choice: Mapping[str, Any], top: int) -> list[dict[str, Any]] | None:
    """llama.cpp's `logprobs.content` in OpenAI's shape (no token ids; `top` alternatives)."""
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return None
    return [{"token": e.get("token", ""), "logprob": e.get("logprob"), "bytes": e.get("bytes"),
             "top_logprobs": [{"token": t.get("token", ""), "logprob": t.get("logprob"), "bytes": t.get("bytes")}
                              for t in (e.get("top_logprobs") or [])[:top]]}
            for e in content]


class ToolCallStream:
    """Reads a constrained tool-call answer as llama.cpp streams it and turns it into OpenAI's
    tool-call fragments as they are generated: a call's first fragment (id, name) once its name
    is complete, then its `arguments` JSON text piece by piece.

    The grammar fixes the shape (`{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`,
    `name` first), so a scanner that tracks strings and nesting depth is enough: the root object
    is depth 1, the array 2, each call object 3, and `arguments` is the value under key
    `arguments` at depth 3. An answer that is `{"response": ...}` yields nothing here.
    """

    def __init__(self) -> None:
        self.text = ""
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.string_start = 0
        self.kinds: list[str] = []  # "{" or "[" per open container
        self.expecting_key: list[bool] = []
        self.keys: list[str | None] = []
        self.index = -1
        self.arguments_open = False
        self.started = False  # at least one call was announced

    def feed(self, piece: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        fragment: list[str] = []
        for ch in piece:
            pos = len(self.text)
            self.text += ch
            if self.arguments_open:
                fragment.append(ch)
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    self._string_done(json.loads(self.text[self.string_start:pos + 1]), out, fragment)
                continue
            if ch == '"':
                self.in_string, self.string_start = True, pos
            elif ch in "{[":
                if self.depth == 3 and self.keys[-1] == "arguments" and not self.arguments_open:
                    self.arguments_open = True
                    fragment.append(ch)
                self.depth += 1
                self.kinds.append(ch)
                self.expecting_key.append(ch == "{")
                self.keys.append(None)
                if self.depth == 3 and ch == "{":
                    self.index += 1
            elif ch in "}]":
                self.depth -= 1
                self.kinds.pop()
                self.expecting_key.pop()
                self.keys.pop()
                if self.arguments_open and self.depth == 3:
                    self.arguments_open = False
                    # this call's arguments end here: sent under its own index now, before a next
                    # call in the same piece moves `index` on (it was glued onto that call)
                    out.append({"index": self.index, "function": {"arguments": "".join(fragment)}})
                    fragment.clear()
            elif ch == "," and self.kinds and self.kinds[-1] == "{":
                self.expecting_key[-1] = True
        if fragment:
            out.append({"index": self.index, "function": {"arguments": "".join(fragment)}})
        return out

    def _string_done(self, value: Any, out: list[dict[str, Any]], fragment: list[str]) -> None:
        if self.arguments_open or not self.kinds or self.kinds[-1] != "{":
            return
        if self.expecting_key[-1]:  # a key
            self.keys[-1] = value
            self.expecting_key[-1] = False
        elif self.depth == 3 and self.keys[-1] == "name" and isinstance(value, str):
            if fragment:
                out.append({"index": self.index, "function": {"arguments": "".join(fragment)}})
                fragment.clear()
            self.started = True
            out.append({"index": self.index, "id": f"call_{secrets.token_hex(12)}", "type": "function",
                        "function": {"name": value, "arguments": ""}})
