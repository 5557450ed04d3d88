"""Conversations keep their llama.cpp slot warm; with more conversations than slots, the KV
state of the least recently used one is saved to disk and restored on its next turn.

llama.cpp reuses the longest common token prefix between a slot's cache and a new prompt
(`cache_prompt`), so a conversation pinned to one slot (`id_slot`) computes only its new tokens.
A slot changing hands is saved first (llama.cpp's `POST /slots/{id}?action=save`, answered by
the in-process server's loopback HTTP API; its Python `handle_*` methods have no slot
actions) and erased or overwritten by the next owner's saved state, so one conversation's
cache never serves another's prompt. A request without a session is nobody's continuation, but
it may reuse the prompt prefix an earlier sessionless request of its own tenant left in a slot
(`scope`: the chat template's opening, a shared system prompt), as llama.cpp's server does for
everyone; a slot is erased before it serves another tenant's, so one tenant's prompts never warm
(nor time) another's. A saved file is restored only into the conversation that wrote it, from
this process and this model (the GGUF, its context size and its chat template: `model_identity`),
and only if its BLAKE3 digest is the one recorded when it was written: a stale, corrupted or
foreign file is refused (and deleted), and the turn is computed in full instead. Neither digest
waits in a request's path: the saved file is hashed in the background (its digest is needed only
at restore), and at restore the bytes are hashed while llama.cpp loads them, the slot being used
only if both agree (else it is erased). BLAKE3 rather than SHA-256: a 10 MiB state hashes in
~2 ms against SHA-256's ~8 ms here, so the check ends before llama.cpp's ~4 ms load does instead
of outlasting it (SHA-256 added ~12 ms to every change of hands); it is as hard to forge.

When a conversation's generation ends, the slot is made ready for its next turn before anyone
asks for it, in the background and outside any request, the slot staying busy until it is:
- it is prepared (`then`, given by the caller: llama.cpp computes the end of the answer's turn and
  the start of the next user message, which every next turn begins with), unless a request is
  already waiting for a slot (it would wait for that work);
- once conversations have had to share slots (a state was saved), its state is saved
  ("write-behind"): the request that later takes the slot finds its previous owner already saved
  and only restores its own. A conversation that comes back warm to its slot drops that copy (it
  is about to grow). While every conversation has a slot of its own, nothing is written.

llama.cpp's own RAM prompt cache is turned off for a pooled runner (`cache_ram_mib = 0`): it
restores by prompt similarity across conversations and tenants, the kind of reuse this pool
exists to rule out. What it gave, the pool gives within a tenant: a sessionless prompt goes to
the tenant's slot whose prompt it continues (`_choose_sessionless`), and a tenant's sessionless
prompt about to be overwritten is saved first ("kept") and restored for that tenant's next
prompt that continues or repeats it, so an OpenAI client's conversation (its whole history sent
again, no session) and a repeated question reuse their tokens as they would on llama-server.
A kept prompt is restored as a copy (the file stays kept): it holds that prompt's start however
often it comes back, so prompts asked in turn are each saved once, not again before every restore.

A conversation with no state of its own (a new session, or one whose state was dropped) starts
from its tenant's state that shares the longest start with its prompt, where llama-server
would prefill it cold or find only what one slot holds: the slot it is given, if its tenant's
state is there (kept in place, not erased), else a copy of a saved state (a conversation's, a
kept prompt) or of an idle slot's (saved first, as a kept prompt), restored without using it up
(SHARED_START characters more than the slot holds, at least). llama.cpp then reuses the common
prefix (the app's system prompt) and computes only the new conversation's own tokens. Only the
same tenant's states count (`session_scope`: a session's tenant is known only where its name
says it): another tenant's are never restored, kept or matched, so nobody's prompt warms (or
times) another tenant's.

With resident slots (`LlamaCppRunner.resident`, `edgellm dev --resident-slots`), the pool has
more slots than the runner computes at once: every slot can hold a conversation or a kept prompt,
and at most `n_parallel` of them are busy (a generation, or a slot readied behind one). So more
conversations and tenants' prompts stay in llama.cpp's memory, where the next turn reuses them
in place instead of waiting for a save and a restore; past that, states are saved as before.

Saved states live under `--state`/slots, within a disk budget (least recently used dropped
first). The index is this process's memory: files a previous process left are deleted at start.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import hashlib
import itertools
import logging
import shutil
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgellm_local.llama.slot_match import SHARED_START, SIMILAR_START, common_start
from edgellm_local.llama.slot_state import SavedState, SlotLease, SlotStats, model_identity, remove_state, state_digest

if TYPE_CHECKING:
    from edgellm_local.llama.runner import LlamaCppRunner

DEFAULT_DISK_BUDGET = 2 * 1024**3
log = logging.getLogger("edgellm.slots")


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


@dataclass
class SlotPool:
    """Which conversation owns which slot, and the states saved for the others.

    All bookkeeping runs on the event loop; llama.cpp's slot actions run in threads.
    """

    runner: "LlamaCppRunner"  # with `slot_dir` set: llama.cpp writes the states there
    disk_budget: int = DEFAULT_DISK_BUDGET
    stats: SlotStats = field(default_factory=SlotStats)
    directory: Path = field(init=False)
    _owners: list[str | None] = field(default_factory=list, init=False, repr=False)
    _scopes: list[str | None] = field(default_factory=list, init=False, repr=False)  # the tenant whose sessionless prompt a slot holds
    _prompts: list[str] = field(default_factory=list, init=False, repr=False)  # that prompt (`prompt_text`), to match the next one against
    _kept: dict[str, tuple[str, str]] = field(default_factory=dict, init=False, repr=False)  # saved sessionless prompts: key -> (scope, prompt)
    _busy: set[int] = field(default_factory=set, init=False, repr=False)
    _used: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _saved: "OrderedDict[str, SavedState]" = field(default_factory=OrderedDict, init=False, repr=False)
    _clock: Any = field(default_factory=itertools.count, init=False, repr=False)
    _waiters: list[asyncio.Future[None]] = field(default_factory=list, init=False, repr=False)
    _queued: int = field(default=0, init=False, repr=False)  # requests waiting for a slot
    _claiming: set[str] = field(default_factory=set, init=False, repr=False)  # sessions whose slot is being prepared
    # Thread futures, not asyncio ones: a digest started while serving one request is read while
    # serving another, which an awaitable may never be (the local edge refuses it, as Workers do).
    _behind: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)  # slots readied and saved behind a release
    # per runner, computed in a hashing thread from the pool's start: reading the GGUF's chat template
    # takes ~2.5 s for SmolLM2-135M, which the first save (a new conversation's first turn) paid on the loop
    _identity: "tuple[LlamaCppRunner, concurrent.futures.Future[str]] | None" = field(default=None, init=False, repr=False)
    _hashing: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="slot-digest"), init=False, repr=False)

    def __post_init__(self) -> None:
        if self.runner.slot_dir is None:
            raise ValueError("a SlotPool needs a runner with slot_dir set")
        self.directory = self.runner.slot_dir
        shutil.rmtree(self.directory, ignore_errors=True)  # never trust a previous process's files
        self.directory.mkdir(parents=True, exist_ok=True)
        self._owners = [None] * self.runner.slots  # resident slots too: they hold states, not generations
        self._scopes = [None] * self.runner.slots
        self._prompts = [""] * self.runner.slots
        self._identity_of(self.runner)

    def _identity_of(self, runner: "LlamaCppRunner") -> "concurrent.futures.Future[str]":
        if self._identity is None or self._identity[0] is not runner:
            self._identity = (runner, self._hashing.submit(model_identity, runner))
        return self._identity[1]

    @property
    def model_id(self) -> str:
        """What a saved state belongs to (`model_identity`), for the runner serving now."""
        return self._identity_of(self.runner).result()

    async def _model_id(self) -> str:
        """`model_id`, waited for in a thread, never on the loop (it is ready unless the pool has just started)."""
        identity = self._identity_of(self.runner)
        return identity.result() if identity.done() else await asyncio.to_thread(identity.result)

    @property
    def _contended(self) -> bool:
        """Conversations have had to share slots: a conversation's state is saved (beyond the
        tenants' kept prompts), so a slot's owner is written behind as its generation ends."""
        return len(self._saved) > len(self._kept)

    def saved(self, session: str) -> SavedState | None:
        return self._saved.get(session)

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        return self._queued

    def owner(self, slot: int) -> str | None:
        return self._owners[slot]

    def file_for(self, session: str) -> Path:
        return self.directory / f"{hashlib.sha256(session.encode()).hexdigest()[:40]}.slot"

    async def acquire(self, session: str | None, scope: str | None = None, prompt: str = "") -> SlotLease:
        """A slot for this session (or for an anonymous request of tenant `scope`, whose `prompt`
        (`prompt_text`) picks among its tenant's slots the one holding the longest common start),
        restored if it was saved; with no saved state of its own, started from its tenant's
        (`scope`) that shares the longest start with `prompt`.

        Choosing is synchronous on the event loop (no lock needed); a request that finds no slot
        waits on a future of its own, which `release` resolves from outside any request, as a
        runtime's queue would (the local edge's loop refuses one request resolving another's).
        """
        while (slot := self._choose(session, scope, prompt)) is None:
            self._queued += 1
            try:
                await self._next_release()
            finally:
                self._queued -= 1
        self._busy.add(slot)
        self._used[slot] = next(self._clock)
        previous = self._owners[slot]
        if session is not None:
            self._claiming.add(session)  # owner of `slot` only once it is prepared (a save may come first)
        try:
            lease = await self._prepare(slot, previous, session, scope, prompt)
            self._prompts[slot] = prompt if scope is not None else ""
            return lease
        except BaseException:
            self._owners[slot] = None
            self._scopes[slot] = None  # what the slot holds is unknown: the next request erases it
            self._prompts[slot] = ""
            await self.release(slot)
            raise
        finally:
            self._claiming.discard(session)  # type: ignore[arg-type]

    def _choose(self, session: str | None, scope: str | None = None, prompt: str = "") -> int | None:
        if len(self._busy) >= max(1, self.runner.n_parallel):
            return None  # as many generations as the runner computes at once (resident slots only hold states)
        if session is not None and session in self._claiming:
            return None  # a slot is being prepared for it: its next turn waits for that one
        if session is not None and session in self._owners:
            slot = self._owners.index(session)
            return None if slot in self._busy else slot  # the same conversation waits for its own slot
        idle = [s for s in range(len(self._owners)) if s not in self._busy]
        if not idle:
            return None
        free = [s for s in idle if self._owners[s] is None]
        if session is None and scope is not None:
            chosen = self._choose_sessionless(free, scope, prompt)
            if chosen is not None:
                return chosen
        if session is not None and scope is not None and session not in self._saved:
            # a new conversation: a free slot holding its tenant's prompt most like its own, kept in place
            own = {s: common_start(self._prompts[s], prompt) for s in free if self._scopes[s] == scope and self._prompts[s]}
            if own and max(own.values()) > 0:
                return max(own, key=lambda s: (own[s], -self._used.get(s, -1)))
        return min(free or idle, key=lambda s: self._used.get(s, -1))

    def _choose_sessionless(self, free: list[int], scope: str, prompt: str) -> int | None:
        """Where llama.cpp's server picks a slot by prompt similarity (and restores others from its
        RAM cache, which a pool turns off), among this tenant's slots only and in this order:
        1. one whose whole prompt this one continues (an OpenAI client sending its history again
           with the next message, or the same question): the longest such;
        2. one whose prompt shares at least SIMILAR_START of this one's (a long shared system
           prompt): the most;
        3. an empty slot, so that the tenant's other prompts stay warm for their own follow-ups;
        4. the one whose prompt starts the most like this one (the chat template's opening at
           least), least recently used on a tie.
        None: the tenant has no slot free (the caller takes the least recently used one)."""
        own = [s for s in free if self._scopes[s] == scope]
        continued = [s for s in own if self._prompts[s] and prompt.startswith(self._prompts[s])]
        if continued:
            return max(continued, key=lambda s: (len(self._prompts[s]), -self._used.get(s, -1)))
        shared = {s: common_start(self._prompts[s], prompt) for s in own}
        best = max(own, key=lambda s: (shared[s], -self._used.get(s, -1)), default=None)
        if best is not None and prompt and shared[best] >= SIMILAR_START * len(prompt):
            return best
        empty = [s for s in free if self._scopes[s] is None]
        if empty:
            return min(empty, key=lambda s: self._used.get(s, -1))
        return best

    async def _prepare(self, slot: int, previous: str | None, session: str | None, scope: str | None = None,
                       prompt: str = "") -> SlotLease:
        held, self._scopes[slot] = self._scopes[slot], scope  # the tenant whose state the slot holds (None: unknown)
        old = self._prompts[slot]
        kept = self._kept_prompt(scope, prompt) if session is None and scope is not None else None
        if previous is None and session is None and scope is not None and held == scope:
            if kept is None or len(self._kept[kept][1]) <= common_start(old, prompt):
                if old and not prompt.startswith(old):
                    await self._keep_prompt(slot, held, old)  # about to be overwritten past the common start
                self.stats.scoped += 1  # its tenant's own earlier prompt: llama.cpp reuses the common prefix
                return SlotLease(slot, None, warm=True)
        if previous is None and held is not None and old and not prompt.startswith(old):
            await self._keep_prompt(slot, held, old)  # a tenant's sessionless prompt, for its own next use
        if previous is not None and previous == session:
            self.stats.warm += 1
            self._drop(session)  # a copy written behind is outgrown by this turn
            return SlotLease(slot, session, warm=True)
        if previous is not None and previous not in self._saved:  # else written behind already
            await self._save(slot, previous, held, old)
        self._owners[slot] = session
        saved = self._saved.get(kept) if kept is not None else None  # a save above may have dropped it
        if saved is not None and kept is not None:
            # A copy, not used up: the file stays kept, so when this slot is overwritten again its
            # prompt is already saved and nobody waits for a second save of the same prompt.
            self._saved.move_to_end(kept)  # recently used: the disk budget drops it last
            if await self._restore(slot, saved, consume=False):
                self.stats.scoped += 1
                self.stats.restores += 1
                return SlotLease(slot, None, restored=True)
            await self._action(slot, "erase")
            return SlotLease(slot, None, refused=True)
        saved = self._saved.pop(session, None) if session is not None else None
        if saved is not None:
            if await self._restore(slot, saved):
                return SlotLease(slot, session, restored=True)
            await self._action(slot, "erase")
            return SlotLease(slot, session, refused=True)
        if scope is not None and prompt:
            lease = await self._start_shared(slot, session, scope, prompt, held, old)
            if lease is not None:
                return lease
        # Nothing of another tenant's (nor of a state of unknown tenant) stays in the slot.
        await self._action(slot, "erase")
        return SlotLease(slot, session)

    async def _start_shared(self, slot: int, session: str | None, scope: str, prompt: str, held: str | None,
                            old: str) -> SlotLease | None:
        """A request with no state of its own, started from its tenant's state sharing the most
        of its prompt's start: a copy restored (`_shared_source`) if that shares SHARED_START
        more than the slot holds, else what the slot holds if it is the tenant's (not erased:
        llama.cpp reuses the common prefix, at least the chat template's opening). None: nothing
        of the tenant's to start from (the caller erases the slot)."""
        here = common_start(old, prompt) if held == scope and old else -1
        source = self._shared_source(slot, scope, prompt, max(here, 0) + SHARED_START)
        state = await self._copy_of(source) if source is not None else None
        if state is not None:
            if await self._restore(slot, state, consume=False):
                self.stats.shared += 1
                self.stats.copied += 1
                return SlotLease(slot, session, shared=True)
            await self._action(slot, "erase")
            return SlotLease(slot, session, refused=True)
        if here >= 0:
            self.stats.shared += 1
            return SlotLease(slot, session, shared=True)
        return None

    def _shared_source(self, slot: int, scope: str, prompt: str, least: int) -> SavedState | int | None:
        """The tenant's state whose prompt shares the longest start with `prompt`, at least
        `least` characters: a saved one (a conversation's, a kept prompt) or an idle slot other
        than `slot` (an int); a saved one on a tie, being ready to restore. Another tenant's, or
        one of unknown tenant, is never a candidate."""
        best: SavedState | int | None = None
        best_key = (least - 1, 0)
        for state in self._saved.values():
            if state.scope == scope and state.prompt:
                key = (common_start(state.prompt, prompt), 1)
                if key > best_key:
                    best, best_key = state, key
        for s in range(len(self._owners)):
            if s != slot and s not in self._busy and self._scopes[s] == scope and self._prompts[s]:
                key = (common_start(self._prompts[s], prompt), 0)
                if key > best_key:
                    best, best_key = s, key
        return best

    async def _copy_of(self, source: SavedState | int) -> SavedState | None:
        """A saved state as is; an idle slot's state saved first as its tenant's kept prompt (the
        slot held meanwhile, so nobody writes into it), so that later ones find it saved."""
        if isinstance(source, SavedState):
            return source
        scope, prompt = self._scopes[source], self._prompts[source]
        assert scope is not None
        self._busy.add(source)
        try:
            key = await self._keep_prompt(source, scope, prompt)
        finally:
            self._free(source)
        return self._saved.get(key)

    async def release(self, slot: int, then: Callable[[int], Awaitable[Any]] | None = None) -> None:
        """The generation on `slot` ended. The slot is made ready for its conversation's next
        turn (`then(slot)`, unless a request waits for a slot) and, under contention, its state
        saved, in the background and outside any request; the slot is free once both are done."""
        owner = self._owners[slot]
        prepare = then if owner is not None and not self._queued else None
        save = owner is not None and self._contended and owner not in self._saved
        if prepare is None and not save:
            self._free(slot)
            return
        task = asyncio.get_running_loop().create_task(self._behind_release(slot, owner, prepare, save),
                                                      context=contextvars.Context())
        self._behind.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._behind.discard)

    async def idle(self) -> None:
        """Until no slot is busy: every generation and every save written behind has ended."""
        while self._busy:
            await self._next_release()

    async def _next_release(self) -> None:
        """Until a slot is freed, on a future of this request's own (resolved by `_free`)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    async def _behind_release(self, slot: int, owner: str | None, prepare: Callable[[int], Awaitable[Any]] | None, save: bool) -> None:
        try:
            if prepare is not None:
                try:
                    await prepare(slot)
                    self.stats.prepared += 1
                except Exception as exc:  # the next turn computes those tokens itself
                    log.warning("could not prepare a slot for its conversation's next turn: %s", exc)
            if save and owner is not None:
                await self._save(slot, owner, self._scopes[slot], self._prompts[slot])
        finally:
            self._free(slot)

    def _free(self, slot: int) -> None:
        self._busy.discard(slot)
        waiters, self._waiters = self._waiters, []
        if waiters:
            asyncio.get_running_loop().call_soon(_wake, waiters, context=contextvars.Context())

    async def _action(self, slot: int, action: str, filename: str | None = None) -> dict[str, Any]:
        return await self.runner.slot_action_async(slot, action, filename)

    async def _save(self, slot: int, session: str, scope: str | None = None, prompt: str = "") -> None:
        """Save the leaving conversation's state (of tenant `scope`, computed for `prompt`). A
        failed save costs that conversation a full recompute on its next turn; it never fails
        the request that needs the slot."""
        path = self.file_for(session)
        try:
            result = await self._action(slot, "save", path.name)
        except Exception as exc:
            log.warning("could not save the slot state of a conversation: %s", exc)
            remove_state(path)
            return
        if not path.is_file():
            return
        size = path.stat().st_size
        state = SavedState(session, path, self._hashing.submit(state_digest, path), size, await self._model_id(),
                           int(result.get("n_saved") or 0), scope, prompt)
        self._saved.pop(session, None)
        self._saved[session] = state
        self.stats.saves += 1
        self._enforce_budget()

    def _kept_prompt(self, scope: str, prompt: str) -> str | None:
        """The key of the longest saved sessionless prompt of `scope` that `prompt` continues (or
        repeats): what llama.cpp's RAM prompt cache would restore, within one tenant."""
        fits = [(len(p), key) for key, (s, p) in self._kept.items() if s == scope and p and prompt.startswith(p) and key in self._saved]
        return max(fits)[1] if fits else None

    async def _keep_prompt(self, slot: int, scope: str, prompt: str) -> str:
        """Save the sessionless prompt a slot holds before another overwrites it, under its
        tenant's name: as llama.cpp's server keeps an evicted prompt in its RAM cache, but per
        tenant (its own cache is shared by everyone, so a pool turns it off), within the same
        disk budget as the conversations' states. A failed save only costs a recompute later.
        Returns its key (in `_saved` unless the save failed)."""
        key = "\x00prompt\x00" + scope + "\x00" + hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()
        if key in self._saved:
            return key
        self._kept[key] = (scope, prompt)
        await self._save(slot, key, scope, prompt)
        if key not in self._saved:
            self._kept.pop(key, None)
        return key

    def _drop(self, session: str) -> None:
        self._kept.pop(session, None)
        stale = self._saved.pop(session, None)
        if stale is not None:
            stale.path.unlink(missing_ok=True)

    def _enforce_budget(self) -> None:
        while self._saved and sum(s.size for s in self._saved.values()) > self.disk_budget:
            key, oldest = self._saved.popitem(last=False)
            self._kept.pop(key, None)
            oldest.path.unlink(missing_ok=True)
            self.stats.dropped += 1

    async def _restore(self, slot: int, saved: SavedState, consume: bool = True) -> bool:
        """Load `saved` into `slot`, if it is intact and this model's. `consume`: the file is used
        up (its conversation's own state, which the slot now holds); else (a copy for another
        conversation of its tenant) it stays saved for its owner, unless it was refused."""
        path = self.file_for(saved.session)
        model = await self._model_id()
        ok = saved.path == path and path.is_file() and saved.model == model and path.stat().st_size == saved.size
        if ok:
            # The bytes are checked while llama.cpp loads them; the caller erases the slot unless both agree.
            # The action first: its request is on its way before the hashing thread starts.
            loaded, intact = await asyncio.gather(self._action(slot, "restore", path.name),
                                                  asyncio.to_thread(self._intact, path, saved), return_exceptions=True)
            ok = (intact is True and isinstance(loaded, dict)
                  and int(loaded.get("n_restored") or 0) == saved.tokens)
        if consume or not ok:
            remove_state(path)  # used once: the slot holds it now, and saves again on eviction
        if not consume and not ok and self._saved.get(saved.session) is saved:
            self._drop(saved.session)
        if ok:
            if consume:
                self.stats.restores += 1
        else:
            self.stats.refused += 1
        return ok

    def _intact(self, path: Path, saved: SavedState) -> bool:
        """In a thread: the file's digest is the one of the bytes llama.cpp wrote at save."""
        try:
            return state_digest(path) == saved.digest.result()
        except OSError:
            return False

    def describe(self) -> dict[str, Any]:
        return {
            "slots": len(self._owners),
            "generating_at_once": max(1, self.runner.n_parallel),  # the rest are resident: states only
            "busy": len(self._busy),  # generating, or readying a slot for its conversation's next turn
            "waiting": self._queued,
            "saved_states": len(self._saved),
            "saved_bytes": sum(s.size for s in self._saved.values()),
            "disk_budget": self.disk_budget,
            **self.stats.to_json(),
        }
