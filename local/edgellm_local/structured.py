"""Structured outputs, tool calls and logprobs on llama.cpp, for any chat GGUF.

JSON mode and JSON schemas are llama.cpp's own grammar-constrained generation
(`response_format`). Tool calls use llama.cpp's "generic" tool-call format, done here rather
than by the runner's chat template (which only handles tools for templates that know them):
the tools are described in a system message and the answer is constrained by a JSON schema to
either `{"tool_calls": [{"name": <one of the tools>, "arguments": <its parameters>}]}` or (with
`tool_choice: "auto"`) `{"response": "<text>"}`, so even a model that has never seen a tool
answers with a valid call. The previous turns of a tool conversation are written back in the
same format, so any chat template can render them.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping

TOOLS_PROMPT = (
    "You can call these tools (JSON Schema of each one's arguments):\n{tools}\n"
    'Answer with one JSON object: {{"tool_calls": [{{"name": "<tool name>", "arguments": {{...}}}}]}} to call tools'
    "{or_answer}."
)


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools become a prompt and a grammar, and its answer tool calls."""

    tools: list[dict[str, Any]]
    choice: Any = None  # None (auto) | "required" | {"type": "function", "function": {"name"}}
    parallel: bool = True
    response_schema: dict[str, Any] | None = None  # a response_format schema the text answer must meet
    functions: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "functions", [t["function"] for t in self.tools])

    @property
    def must_call(self) -> bool:
        return self.choice is not None

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
        or_answer = "" if self.must_call else ', or {"response": "<your answer>"} to answer directly'
        return TOOLS_PROMPT.format(tools=tools, or_answer=or_answer)

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The constrained answer -> (text, []) or (None, OpenAI tool calls)."""
        try:
            data = json.loads(text)
        except ValueError:
            return text, []  # cut by max_tokens mid-JSON: passed on as text (finish_reason says "length")
        if isinstance(data, dict) and isinstance(data.get("tool_calls"), list):
            return None, [{"id": f"call_{secrets.token_hex(12)}", "type": "function",
                           "function": {"name": c.get("name"), "arguments": json.dumps(c.get("arguments"), ensure_ascii=False)}}
                          for c in data["tool_calls"] if isinstance(c, dict)]
        if isinstance(data, dict) and "response" in data:
            response = data["response"]
            return (response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)), []
        return text, []


def _json_arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def history(messages: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A tool conversation's turns in the generic format: a call is the JSON the model would
    have written, a result a user turn holding `{"tool_response": ...}`."""
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _json_arguments(c["function"]["arguments"])} for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
        elif m.get("role") == "tool":
            response = {"tool": names.get(m.get("tool_call_id"), ""), "tool_call_id": m.get("tool_call_id"), "content": m["content"]}
            out.append({"role": "user", "content": json.dumps({"tool_response": response}, ensure_ascii=False)})
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
    if messages is not None and any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        body["messages"] = messages = history(messages)
    fmt = inputs.get("response_format")
    if inputs.get("tools"):
        schema = fmt.get("json_schema") if fmt and fmt.get("type") == "json_schema" else None
        plan = ToolPlan(list(inputs["tools"]), inputs.get("tool_choice"), inputs.get("parallel_tool_calls", True) is not False, schema)
        body["messages"] = with_system(list(messages or []), plan.system_prompt())
        body["response_format"] = {"type": "json_schema", "json_schema": {"schema": plan.schema()}}
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
