"""One loaded GGUF in an in-process llama.cpp server (xllamacpp embeds llama.cpp's own server):
its lifecycle (start on first use, cancel, close), its calls, slot actions on its loopback port,
and the queue of generations it admits."""

from __future__ import annotations

import functools
import json
import os
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellm.admission import Admission, Ticket
from edgellm.errors import GatewayError
from edgellm.ports import BindingError, CapacityExceeded

from edgellm_local.llama.control_tokens import special_pattern, special_texts
from edgellm_local.llama.embedded_server import start_server
from edgellm_local.llama.errors import RunnerStopping, public, raise_llama_error
from edgellm_local.llama.loopback import Loopback
from edgellm_local.llama.model_file import ModelFileError
from edgellm_local.llama.start_places import StartPlaces

# A user message's text, to find where the chat template puts it (never sent to the model).
NEXT_TURN = "EDGELLM_NEXT_TURN_5f1c2a"
# The runner's queue bound per llama.cpp slot, unless `max_waiting` says otherwise: generations in
# flight or waiting for a slot. The gateway's admission (`Config.max_waiting_generations`, 32 per
# isolate) is the same policy in front of it; this is the binding's own capacity, as Workers AI
# has one (3040). With 8 per slot, misses admitted under bench_abuse's 200 clients on two busy
# cores waited past a client's 120 s.
QUEUE_PER_SLOT = 4


@dataclass
class LlamaCppRunner:
    """One loaded GGUF in an in-process llama.cpp server. Calls block; run them in threads."""

    path: Path
    n_ctx: int = 4096
    n_parallel: int = 2  # generations computed at once (each in a slot of `slot_context` tokens)
    # Slots beyond those that only hold states (a slot pool's idle conversations and kept prompts)
    # and are never computed all at once: llama.cpp gets n_parallel + resident slots of the same
    # context, and a pool runs at most n_parallel generations among them. A state that stays in
    # one needs no save and no restore (~4 ms each way, and a change of hands the next turn
    # waits for); the price is their KV memory (23 KiB a token on SmolLM2-135M: 4 resident slots
    # of 2,048 tokens are ~190 MB): `model_file.resident_slots_within` sizes them by a memory budget.
    resident: int = 0
    threads: int = max(1, os.cpu_count() or 1)
    slot_dir: Path | None = None  # where llama.cpp saves slot states (a SlotPool manages them)
    cache_ram_mib: int | None = None  # llama.cpp's own RAM prompt cache; 0 turns it off
    chat_template: str | None = None  # overrides the GGUF's own template (llama.cpp's --chat-template)
    # generations in flight or queued (default QUEUE_PER_SLOT per slot); refused, they get a 503 + Retry-After
    max_waiting: int | None = None
    # how long a request may wait for a slot before it is refused (503 + Retry-After): the
    # queue bounds how many wait, this how long (4 streams once waited 90 s without a byte)
    start_timeout: float = 30.0
    _server: Any = field(default=None, init=False, repr=False)
    _queue: Admission = field(default_factory=Admission, init=False, repr=False)  # the generations admitted (admit)
    _tickets: dict[str | None, list[Ticket]] = field(default_factory=dict, init=False, repr=False)  # each tenant's places
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stopping: bool = field(default=False, init=False, repr=False)  # no new generations (cancel_generations)
    _closed: bool = field(default=False, init=False, repr=False)  # no server either (close)
    _generations: set[threading.Event] = field(default_factory=set, init=False, repr=False)  # their stop flags
    # without a slot pool, a place per llama.cpp slot, waited for within start_timeout (start_places.py)
    starts: StartPlaces = field(default=None, init=False, repr=False)  # type: ignore[assignment]
    _client: Loopback | None = field(default=None, init=False, repr=False)  # the loop's client of the loopback port

    def __post_init__(self) -> None:
        if self.resident < 0:
            raise ValueError(f"resident slots cannot be negative: {self.resident}")
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
                params.n_ctx = self.slot_context * self.slots  # every slot as large as a generation's
                params.n_parallel = self.slots
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
            client, self._client = self._client, None
        if client is not None:
            client.close()
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

    async def slot_action_async(self, slot: int, action: str, filename: str | None = None) -> dict[str, Any]:
        """`slot_action` from the event loop, without a thread (loopback.py: a request waiting for
        a restore waited 2-4 ms for a 0.4 ms load through urllib in a thread)."""
        server = self._serving()  # held until the action returns: `close` never drops the server under it
        base = server.listening_address.rstrip("/")
        client = self._client
        if client is None or client.url != base:  # first use, or a server started anew
            if client is not None:
                client.close()
            client = self._client = Loopback(base)
        return await client.post(f"/slots/{slot}?action={action}", {"filename": filename} if filename else {}, f"slot {action}")

    def _loopback(self, path: str, payload: dict[str, Any], what: str) -> dict[str, Any]:
        # The server is held until the call returns, as `chat` holds it: were `close` to drop the
        # last reference meanwhile, its destructor (which keeps the GIL while it joins llama.cpp's
        # threads) would wait for this request's handler, while this thread waited for the GIL.
        server = self._serving()
        base = server.listening_address.rstrip("/")
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
        raise_llama_error(result)
        return int(((result or {}).get("timings") or {}).get("prompt_n") or 0)

    def admit(self, tenant: str | None = None) -> None:
        """Hold a place in this runner's queue, or refuse as Workers AI does when it is full
        (3040, a 503 with Retry-After): a flood of misses waits in a bounded line, not forever.
        The queue is the core's own `Admission` (the same count and the same fair share per
        tenant), bounded by this runner's `max_waiting`; only the refusal is the binding's."""
        with self._lock:
            try:
                ticket = self._queue.admit(self.max_waiting or QUEUE_PER_SLOT * max(1, self.n_parallel), tenant)
            except GatewayError:
                raise CapacityExceeded("3040: Capacity temporarily exceeded, please try again.") from None
            self._tickets.setdefault(tenant, []).append(ticket)

    def release(self, tenant: str | None = None) -> None:
        """Give back a place `tenant` holds (none held: nothing to give back)."""
        with self._lock:
            tickets = self._tickets.get(tenant)
            if tickets:
                tickets.pop().release()
                if not tickets:
                    del self._tickets[tenant]

    @property
    def _active(self) -> int:
        """Places held now."""
        return self._queue.active

    @property
    def slot_context(self) -> int:
        """Tokens one request can hold: n_ctx split evenly between the generating slots."""
        return self.n_ctx // max(1, self.n_parallel)

    @property
    def slots(self) -> int:
        """llama.cpp's slots: the generating ones and the resident ones."""
        return max(1, self.n_parallel) + self.resident  # never negative (__post_init__)

    @functools.cached_property
    def special_pattern(self) -> Any:
        """The model's control-token texts as one regex (read from the GGUF once)."""
        return special_pattern(special_texts(self.path))
