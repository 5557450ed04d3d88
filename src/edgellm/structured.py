"""Structured outputs, tool calls and logprobs: parsing OpenAI's (and Workers AI's) request
shapes into the Workers AI input the binding takes.

In Workers AI terms (what `GenerationRequest.inputs` holds, what the binding and the cache key
see):
- `response_format`: `{"type": "json_object"}` or `{"type": "json_schema", "json_schema": <schema>}`
  (Workers AI's JSON mode puts the schema itself under `json_schema`; OpenAI wraps it in
  `{name, schema, strict}`);
- `tools`: `[{"type": "function", "function": {"name", "description"?, "parameters"?}}]`;
- `tool_choice`: only when it forces something (`"required"` or `{"type": "function", "function":
  {"name"}}`); `"auto"` is the default and `"none"` drops the tools altogether, so the model
  never sees them and cannot call one;
- `parallel_tool_calls`: only when `false`;
- `logprobs` / `top_logprobs`: an edge extension only a llama.cpp backend honours.
Invalid shapes are a 400 `invalid_request_error` naming the parameter; whether the serving model
can honour a valid one is `capabilities.enforce`'s question.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from typing import Any, Mapping

from .errors import invalid
from .generation import ToolCallDelta
from .schema_bounds import check_schema, check_together
from .validation import as_bool, as_int

MAX_TOOLS = 128
MAX_TOP_LOGPROBS = 20
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(f"'{param}' must be an object.", param, "invalid_type")
    return value


def parse_response_format(value: Any, *, openai_shape: bool) -> dict[str, Any] | None:
    """OpenAI's (or Workers AI's) `response_format` -> Workers AI's, or None for plain text."""
    if value is None:
        return None
    fmt = _object(value, "response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        if fmt.get("schema") is not None:  # llama.cpp's spelling of a schema'd JSON mode: checked and honoured, never dropped
            check_schema(fmt["schema"], "response_format.schema")
            return {"type": "json_schema", "json_schema": fmt["schema"]}
        return {"type": "json_object"}
    if kind != "json_schema":
        raise invalid(f"'response_format.type' must be one of 'text', 'json_object', 'json_schema'; got {kind!r}.",
                      "response_format", "invalid_value")
    spec = fmt.get("json_schema")
    if not openai_shape:
        check_schema(spec, "response_format.json_schema")
        return {"type": "json_schema", "json_schema": spec}
    spec = _object(spec, "response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
        raise invalid("'response_format.json_schema.name' is required: 1-64 letters, digits, '_' or '-'.",
                      "response_format", "invalid_value")
    schema = spec.get("schema", {})
    check_schema(schema, "response_format.json_schema.schema")
    return {"type": "json_schema", "json_schema": schema}


def _function(tool: Any, where: str) -> dict[str, Any]:
    """One tool, OpenAI's `{type: function, function: {...}}` or Workers AI's older flat
    `{name, description, parameters}`, as OpenAI's shape."""
    tool = _object(tool, where)
    if "function" in tool or tool.get("type") is not None:
        if tool.get("type") != "function":
            raise invalid(f"'{where}.type' must be 'function'; got {tool.get('type')!r}.", where, "invalid_value")
        spec = _object(tool.get("function"), f"{where}.function")
    else:
        spec = tool
    name = spec.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
        raise invalid(f"'{where}.function.name' must be 1-64 letters, digits, '_' or '-'.", where, "invalid_value")
    function: dict[str, Any] = {"name": name}
    if spec.get("description") is not None:
        if not isinstance(spec["description"], str):
            raise invalid(f"'{where}.function.description' must be a string.", where, "invalid_type")
        function["description"] = spec["description"]
    if spec.get("parameters") is not None:
        check_schema(spec["parameters"], f"{where}.function.parameters")
        function["parameters"] = spec["parameters"]
    return {"type": "function", "function": function}


def parse_tools(body: dict[str, Any]) -> dict[str, Any]:
    """`tools`, `tool_choice`, `parallel_tool_calls` -> the inputs entries (see module doc)."""
    tools_value, choice, parallel = body.get("tools"), body.get("tool_choice"), as_bool(body, "parallel_tool_calls")
    if tools_value is None:
        if choice not in (None, "none"):
            raise invalid("'tool_choice' is only allowed when 'tools' are given.", "tool_choice", "invalid_value")
        if parallel is not None:
            raise invalid("'parallel_tool_calls' is only allowed when 'tools' are given.", "parallel_tool_calls", "invalid_value")
        return {}
    if not isinstance(tools_value, list) or not tools_value:
        raise invalid("'tools' must be a non-empty array of functions.", "tools", "invalid_type")
    if len(tools_value) > MAX_TOOLS:
        raise invalid(f"'tools' may hold at most {MAX_TOOLS} functions.", "tools")
    tools = [_function(t, f"tools[{i}]") for i, t in enumerate(tools_value)]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise invalid("'tools' must not name a function twice.", "tools", "invalid_value")
    out: dict[str, Any] = {}
    if choice is None or choice == "auto":
        pass
    elif choice == "none":
        return {}  # no tool may be called: the model is not shown any
    elif choice == "required":
        out["tool_choice"] = "required"
    elif isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise invalid("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                          "tool_choice", "invalid_value")
        if name not in names:
            raise invalid(f"'tool_choice' names the function {name!r}, which is not in 'tools'.", "tool_choice", "invalid_value")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise invalid("'tool_choice' must be 'none', 'auto', 'required' or a named function.", "tool_choice", "invalid_value")
    out = {"tools": tools, **out}
    if parallel is False:
        out["parallel_tool_calls"] = False
    return out


def parse_logprobs(body: dict[str, Any]) -> dict[str, Any]:
    logprobs = as_bool(body, "logprobs")
    top = as_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise invalid("'top_logprobs' needs 'logprobs': true.", "top_logprobs", "invalid_value")
    if not logprobs:
        return {}
    return {"logprobs": True, "top_logprobs": top or 0}


def parse_extensions(body: dict[str, Any], *, openai_shape: bool) -> dict[str, Any]:
    """Every structured-output, tool and logprobs field of a chat request, as inputs entries."""
    out: dict[str, Any] = {}
    response_format = parse_response_format(body.get("response_format"), openai_shape=openai_shape)
    if response_format is not None:
        out["response_format"] = response_format
    out.update(parse_tools(body))
    if out.get("tools"):  # the tools and the response_format become one grammar: bounded together
        schemas = [t["function"].get("parameters") or {} for t in out["tools"]]
        if response_format is not None and response_format["type"] == "json_schema":
            schemas.append(response_format["json_schema"])
        check_together(schemas, "tools", choices=len(schemas))
    out.update(parse_logprobs(body))
    return out


# --- messages of a tool conversation ---------------------------------------------------------


def is_tool_message(message: Any) -> bool:
    return isinstance(message, dict) and (message.get("role") == "tool" or message.get("tool_calls") is not None)


def validate_tool_message(message: dict[str, Any], where: str) -> dict[str, Any]:
    """A `role: "tool"` result, or an assistant turn with `tool_calls` (content may be null)."""
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        if not isinstance(content, str):
            raise invalid(f"'{where}.content' must be a string.", f"{where}.content", "invalid_type")
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid(f"'{where}.tool_call_id' is required on a tool message.", f"{where}.tool_call_id", "invalid_value")
        return {"role": "tool", "content": content, "tool_call_id": call_id}
    if role != "assistant":
        raise invalid(f"'{where}.tool_calls' is only allowed on assistant messages.", f"{where}.tool_calls", "invalid_value")
    if content is not None and not isinstance(content, str):
        raise invalid(f"'{where}.content' must be a string or null.", f"{where}.content", "invalid_type")
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise invalid(f"'{where}.tool_calls' must be a non-empty array.", f"{where}.tool_calls", "invalid_type")
    checked = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(call, dict) or not isinstance(call.get("id"), str) or call.get("type", "function") != "function"
                or not isinstance(function, dict) or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments"), str)):
            raise invalid(f"'{at}' must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\": <JSON string>}}}}.",
                          at, "invalid_value")
        checked.append({"id": call["id"], "type": "function",
                        "function": {"name": function["name"], "arguments": function["arguments"]}})
    return {"role": "assistant", "content": content or "", "tool_calls": checked}


# --- what a backend returns -----------------------------------------------------------------


def new_call_id() -> str:
    """An id for a call the backend gave none (OpenAI's `call_` and 24 hex digits)."""
    return f"call_{secrets.token_hex(12)}"


def tool_call_deltas(raw: Any, *, first_index: int = 0) -> list[ToolCallDelta]:
    """A binding's `tool_calls` -> events. Accepts OpenAI's shape (whole calls or stream
    fragments: `{index?, id?, type, function: {name?, arguments?}}`) and Workers AI's
    (`{name, arguments: <object>}`); arguments given as an object become a JSON string, and a
    call without an id is given one."""
    if not isinstance(raw, list):
        return []
    deltas = []
    for offset, call in enumerate(raw):
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else call
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        index = call.get("index") if isinstance(call.get("index"), int) else first_index + offset
        name = function.get("name") if isinstance(function.get("name"), str) else None
        call_id = call.get("id") if isinstance(call.get("id"), str) else None
        if call_id is None and name is not None:  # the first fragment of a call names it
            call_id = new_call_id()
        deltas.append(ToolCallDelta(index, call_id, name, arguments))
    return deltas


def response_text(value: Any) -> str | None:
    """Workers AI's JSON mode answers `response` as an object; OpenAI's content is its JSON text."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return value if isinstance(value, str) else None


def for_workers_ai_binding(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Workers AI's function-calling quirks, applied at its binding: it validates tool-call ids
    as nine letters or digits (OpenAI's and its own `chatcmpl-tool-...` ids fail) and refuses a
    null `content` on a tool-calling turn. Ids are mapped by a hash, so a call and its result
    keep matching."""
    messages = inputs.get("messages")
    if not isinstance(messages, list) or not any(is_tool_message(m) for m in messages):
        return dict(inputs)

    def short(call_id: str) -> str:
        return call_id if re.fullmatch(r"[A-Za-z0-9]{9}", call_id) else hashlib.sha256(call_id.encode()).hexdigest()[:9]

    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["content"] = m.get("content") or ""
            m["tool_calls"] = [{**c, "id": short(c["id"])} for c in m["tool_calls"]]
        if m.get("tool_call_id"):
            m["tool_call_id"] = short(m["tool_call_id"])
        out.append(m)
    return {**inputs, "messages": out}


CHAT_ONLY = ("response_format", "tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs")


def refuse_chat_only(body: Mapping[str, Any], where: str) -> None:
    """A prompt (not messages) cannot carry these: refused by name rather than dropped."""
    for name in CHAT_ONLY:
        if body.get(name) is not None:
            raise invalid(f"'{name}' is only supported with 'messages' ({where}).", name, "unsupported_parameter")
