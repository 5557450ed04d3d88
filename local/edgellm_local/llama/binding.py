"""Workers AI backed by a real llama.cpp runner (xllamacpp embeds llama.cpp's own server).

It behaves like the binding the Worker gets: the same input schema and defaults (temperature
0.6, max_tokens 256: the model's published JSON schema in `schemas/`), the same output and stream
event shapes, and the same failures (an unknown model id raises `ModelNotFound`, a schema
violation `InvalidModelInput`).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, AsyncIterator, Mapping

from edgellm.admission import admitted_tenant
from edgellm.capabilities import CAPABILITY_NAMES
from edgellm.config import Config
from edgellm.ports import CapacityExceeded, ContextWindowExceeded, InvalidModelInput, ModelNotFound

from edgellm_local.emulator.isolation import OwnedStream
from edgellm_local.llama import grammar as structured
from edgellm_local.llama.bridge import stream_events
from edgellm_local.llama.control_tokens import defuse_messages
from edgellm_local.llama.embedding_runner import EmbeddingRunner
from edgellm_local.llama.errors import public
from edgellm_local.llama.event_streams import Prepended, leased, structured_events
from edgellm_local.llama.grammar import ToolPlan
from edgellm_local.llama.input_schema import InputSchema
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.slot_match import prompt_text, session_scope
from edgellm_local.llama.slot_pool import SlotPool
from edgellm_local.llama.slot_state import SlotLease
from edgellm_local.llama.wire import to_llama_request


@dataclass
class LlamaCppAI:
    """The local `env.AI`: model ids (from config) -> a llama.cpp runner standing in for them.
    Every id is held to the text-generation input schema of the default model."""

    models: dict[str, LlamaCppRunner]
    config: Config = field(default_factory=Config)
    slots: SlotPool | None = None  # pins every request to a slot; sessions keep theirs warm or saved
    inputs: InputSchema = field(default_factory=InputSchema.load)
    # embedding model ids (Workers AI's bge) -> the llama.cpp embedding model standing in for them
    embedders: dict[str, EmbeddingRunner] = field(default_factory=dict)
    # model -> (its runner, the facts that stay while it serves): made once, not per answer
    _facts: dict[str, tuple[LlamaCppRunner, Mapping[str, Any]]] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def for_config(cls, config: Config, runner: LlamaCppRunner) -> "LlamaCppAI":
        return cls({model: runner for model in config.models}, config)

    def _runners(self) -> list[LlamaCppRunner]:
        return list({id(runner): runner for runner in self.models.values()}.values())  # one may serve several ids

    def cancel_generations(self) -> None:
        """`LlamaCppRunner.cancel_generations` on every runner."""
        for runner in self._runners():
            runner.cancel_generations()

    def close(self) -> None:
        """`LlamaCppRunner.close` on every runner, and every embedding runner closed."""
        for runner in self._runners():
            runner.close()
        for embedder in {id(e): e for e in self.embedders.values()}.values():
            embedder.close()

    async def embed(self, model: str, texts: list[str]) -> dict[str, Any]:
        """Workers AI's bge output (`{"shape", "data"}`) from the stand-in embedding model, plus
        the `usage` llama.cpp counts (the real binding says none)."""
        embedder = self.embedders.get(model)
        if embedder is None:
            raise ModelNotFound(f"5007: No such model {model} or task")
        vectors, tokens = await asyncio.to_thread(embedder.embed, texts)
        width = len(vectors[0]) if vectors else 0
        return {"shape": [len(vectors), width], "data": vectors, "usage": {"prompt_tokens": tokens}}

    def describe(self, model: str, *, live: bool = True) -> Mapping[str, Any] | None:
        embedder = self.embedders.get(model)
        if embedder is not None:  # a stand-in: its vectors are the GGUF's, not bge's
            return {"backend": "llama.cpp", "gguf": str(embedder.path), "gguf_name": embedder.path.name, "build": _build(),
                    "dimensions": embedder.dimensions}
        runner = self.models.get(model)
        if runner is None:
            return None
        kept = self._facts.get(model)
        if kept is None or kept[0] is not runner:
            facts = {"backend": "llama.cpp", "gguf": str(runner.path), "gguf_name": runner.path.name, "context_window": runner.slot_context,
                     # constrained generation makes any GGUF honour every one of these (structured.py)
                     "capabilities": tuple(CAPABILITY_NAMES), "build": _build()}
            kept = self._facts[model] = (runner, MappingProxyType(facts))
        if not live or self.slots is None:
            return kept[1]  # read-only: every answer's (HITs too) for the same runner
        return {**kept[1], "capabilities": list(CAPABILITY_NAMES), "slots": self.slots.describe()}

    def _structure(self, inputs: Mapping[str, Any], kind: str, body: dict[str, Any]) -> tuple[ToolPlan | None, int | None]:
        """JSON mode, tools and logprobs onto the llama.cpp body: (tool plan, top_logprobs or None)."""
        if kind != "chat" or "messages" not in inputs:
            return None, None
        if inputs.get("tools") and inputs.get("logprobs"):
            raise public(InvalidModelInput("5006: logprobs cannot be combined with tools on the local edge (the logprobs would be those of the tool-call JSON)"))
        plan = structured.apply(inputs, body)
        return plan, (int(inputs.get("top_logprobs") or 0) if inputs.get("logprobs") else None)

    def _prepare(self, model: str, inputs: Mapping[str, Any]) -> tuple[LlamaCppRunner, str, dict[str, Any]]:
        runner = self.models.get(model)
        if runner is None:
            raise ModelNotFound(f"5007: No such model {model} or task")
        checked = self.inputs.check(inputs)
        if "lora" in checked:
            raise public(InvalidModelInput("5006: LoRA adapters are not available on the local edge"))
        max_tokens = int(checked.get("max_tokens") or 0)
        if max_tokens > runner.slot_context:
            raise public(ContextWindowExceeded(f"5006: max_tokens {max_tokens} exceeds the {runner.slot_context} tokens the serving slot holds "
                                               f"(llama.cpp splits its context of {runner.n_ctx} tokens between {runner.n_parallel} slots): "
                                               f"raise it with `edgellm dev --ctx-size N` (or fewer `--slots`), "
                                               f"e.g. --ctx-size {max_tokens * max(1, runner.n_parallel) * 2}"))
        kind, body = to_llama_request(checked)
        try:  # JSON input may hold a lone surrogate; llama.cpp's JSON parser would throw on it
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise public(InvalidModelInput("5006: the input is not valid Unicode (it holds a lone surrogate)")) from exc
        return runner, kind, body

    @property
    def scoped_prefix_reuse(self) -> bool:
        """Requests without a session reuse the prompt prefix their tenant's earlier requests
        left in a slot (`prefix_scope`): with a slot pool, which keeps tenants apart."""
        return self.slots is not None

    async def _lease(self, session: str | None, body: dict[str, Any], scope: str | None = None) -> SlotLease | None:
        if self.slots is None:
            return None
        if session is not None:  # its tenant, where its name agrees (the core tells a session's binding no scope)
            scope = session_scope(session, admitted_tenant())
        lease = await self.slots.acquire(session, scope, prompt_text(body) if scope is not None else "")
        body.update(id_slot=lease.slot, cache_prompt=True)
        return lease

    async def _admitted_lease(self, runner: LlamaCppRunner, session: str | None, body: dict[str, Any], tenant: str | None,
                              scope: str | None = None) -> SlotLease | None:
        """A place in the runner's queue, then a slot (which may mean waiting for one): the queue's
        bound counts the requests waiting for a slot, so a flood is refused at once, not queued,
        and a request that finds no slot within `start_timeout` is refused then (3040, a 503).
        The place is released when the generation's events end or are closed (stream_events)."""
        runner.admit(tenant)
        try:
            if self.slots is None:  # llama.cpp's own queue has no deadline: wait for a start place instead
                await runner.starts.acquire(runner.start_timeout)
                return None
            async with asyncio.timeout(runner.start_timeout):  # in this task: the lease stays this request's
                return await self._lease(session, body, scope)
        except TimeoutError:
            runner.release(tenant)
            raise public(CapacityExceeded(f"3040: Capacity temporarily exceeded: no slot was free within {runner.start_timeout:g} s, please try again.")) from None
        except BaseException:
            runner.release(tenant)
            raise

    async def _release(self, lease: SlotLease | None, then: Callable[[int], Awaitable[Any]] | None = None) -> None:
        if lease is not None and self.slots is not None:
            await self.slots.release(lease.slot, then)

    @staticmethod
    def _next_turn(runner: LlamaCppRunner, kind: str, body: dict[str, Any], lease: SlotLease | None,
                   plan: ToolPlan | None, answer: str) -> Callable[[int], Awaitable[Any]] | None:
        """What readies a conversation's slot for its next turn once this answer is complete (see
        `LlamaCppRunner.prefill`): the messages as llama.cpp got them and the answer as the client
        will send it back. Only for a session's plain chat: a tool call comes back as tool messages,
        not as this text."""
        if lease is None or lease.session is None or kind != "chat" or plan is not None:
            return None
        messages = [*body["messages"], *defuse_messages([{"role": "assistant", "content": answer}], runner.special_pattern)]
        return lambda slot: asyncio.to_thread(runner.prefill, slot, messages)

    @staticmethod
    def _as_text(runner: LlamaCppRunner, body: dict[str, Any]) -> None:
        """Message content reaches the model as text, never as control tokens (the model's own,
        read from its GGUF); raw prompts are the caller's own."""
        if "messages" in body:
            body["messages"] = defuse_messages(body["messages"], runner.special_pattern)

    async def run(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None,
                  prefix_scope: str | None = None) -> dict[str, Any]:
        """The whole answer, generated through llama.cpp's streaming callback so that cancelling
        this (a client that left before its JSON answer) stops the generation at its next token.
        Its text, tool calls and logprobs are read by the same `structured_events` a stream goes
        through, so a whole answer is what its own stream assembles to (a cut envelope included)."""
        runner, kind, body = self._prepare(model, inputs)
        plan, top = self._structure(inputs, kind, body)
        self._as_text(runner, body)  # after the structure: tool descriptions and past calls become message text
        body.update(stream=True, stream_options={"include_usage": True})
        parts: list[str] = []
        usage: dict[str, Any] = {}
        finish: str | None = None
        logprobs: list[dict[str, Any]] = []
        calls: dict[int, dict[str, Any]] = {}
        tenant = admitted_tenant()
        lease = await self._admitted_lease(runner, session, body, tenant, prefix_scope)
        then = None
        try:
            events = stream_events(runner, kind, body, tenant, placed=self.slots is None)
            raw = events
            if plan is not None or top is not None:
                events = structured_events(events, plan, top)
            try:
                async for event in events:
                    parts.append(event.get("response") or "")
                    usage = event.get("usage") or usage
                    finish = event.get("finish_reason") or finish
                    if top is not None and "logprobs" in event:
                        logprobs.extend(event["logprobs"] or [])
                    for fragment in event.get("tool_calls") or ():
                        _merge_call(calls, fragment)
            finally:
                await events.aclose()  # type: ignore[attr-defined]
                if events is not raw:
                    await raw.aclose()  # type: ignore[attr-defined]
            then = self._next_turn(runner, kind, body, lease, plan, "".join(parts))
        finally:
            await self._release(lease, then)
        out: dict[str, Any] = {"response": "".join(parts), "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, **usage}}
        if calls:
            out["tool_calls"] = [calls[i] for i in sorted(calls)]
        if top is not None:
            out["logprobs"] = logprobs
        if finish:
            out["finish_reason"] = finish
        return out

    async def stream(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None,
                     prefix_scope: str | None = None) -> AsyncIterator[dict[str, Any]]:
        runner, kind, body = self._prepare(model, inputs)
        plan, top = self._structure(inputs, kind, body)
        self._as_text(runner, body)  # after the structure: tool descriptions and past calls become message text
        # timings on every chunk: the prompt's tokens are known from the first one (a stream cut by a stop sequence says them)
        body.update(stream=True, stream_options={"include_usage": True}, timings_per_token=True)
        tenant = admitted_tenant()
        lease = await self._admitted_lease(runner, session, body, tenant, prefix_scope)
        events = stream_events(runner, kind, body, tenant, placed=self.slots is None)
        if plan is not None or top is not None:
            events = structured_events(events, plan, top)
        events = leased(functools.partial(self._release, lease), events, lambda answer: self._next_turn(runner, kind, body, lease, plan, answer))
        # Like the real binding, refuse at the call (before any byte is sent) rather than
        # mid-stream: wait for the first event, so a rejected input (context too long) raises here.
        try:
            first = await anext(events)
        except StopAsyncIteration:
            first = None
        return OwnedStream(Prepended(first, events))  # the request that opened it owns it


@functools.cache
def _build() -> str:
    """The llama.cpp build serving (xllamacpp's version pins it), for `system_fingerprint`.
    Read once: `importlib.metadata` parses the package's METADATA file on every call, ~2 ms,
    and every answer (HITs included) asks for it twice."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"xllamacpp-{version('xllamacpp')}"
    except PackageNotFoundError:
        return "xllamacpp"


def _merge_call(calls: dict[int, dict[str, Any]], fragment: Mapping[str, Any]) -> None:
    """One OpenAI tool-call fragment into the whole call of its index (as a streaming client does)."""
    function = fragment.get("function") or {}
    call = calls.setdefault(int(fragment.get("index") or 0), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call["id"] = fragment.get("id") or call["id"]
    call["function"]["name"] = function.get("name") or call["function"]["name"]
    call["function"]["arguments"] += function.get("arguments") or ""
