"""A slot's state on disk: what the pool records when llama.cpp saves one (its BLAKE3 digest, the
model it belongs to, its tenant and prompt), the leases and counters the pool hands out, and the
identity a saved state must match to be restored (`model_identity`)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import blake3

from edgellm_local.llama.model_file import gguf_metadata

if TYPE_CHECKING:
    from edgellm_local.llama.runner import LlamaCppRunner


@dataclass(frozen=True)
class SavedState:
    """One conversation's slot state on disk, as recorded when llama.cpp wrote it, with the
    tenant whose it is and the prompt (`prompt_text`) it was computed for, when known: what a
    new conversation of that tenant is matched against (SHARED_START)."""

    session: str
    path: Path
    digest: "concurrent.futures.Future[str]"  # BLAKE3, computed in the pool's hashing threads
    size: int
    model: str
    tokens: int
    scope: str | None = None
    prompt: str = ""


@dataclass(frozen=True)
class SlotLease:
    """A slot held for one generation. `restored` says a saved state was loaded for it;
    `refused` that one existed but failed its checks (and was not used)."""

    slot: int
    session: str | None
    warm: bool = False
    restored: bool = False
    refused: bool = False
    shared: bool = False  # no state of its own: started from its tenant's sharing its prompt's start


@dataclass
class SlotStats:
    warm: int = 0
    saves: int = 0
    restores: int = 0
    refused: int = 0
    prepared: int = 0  # slots made ready for their conversation's next turn as a generation ended
    scoped: int = 0  # requests without a session that found their tenant's earlier prompt in the slot
    dropped: int = 0  # saved states deleted to stay within the disk budget
    shared: int = 0  # requests with no state of their own started from their tenant's state sharing their prompt's start
    copied: int = 0  # of those, from a copy restored (a saved state, or an idle slot saved for it), not kept in place

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


def state_digest(path: Path) -> str:
    # one thread: the other core is llama.cpp's, loading or computing
    return blake3.blake3(max_threads=1).update_mmap(path).hexdigest()


TEMPLATE_KEY = "tokenizer.chat_template"


def model_identity(runner: "LlamaCppRunner") -> str:
    """Everything a slot's KV state depends on: the GGUF (its path, size and modification time:
    another file, or the same path rewritten), the context it was loaded with (n_ctx and how it is
    split between slots) and the chat template the prompts were rendered with (the runner's
    override, else the GGUF's own). A state saved under any other identity is refused at restore,
    even where llama.cpp would load it without complaint (a same-shaped model, a larger context)."""
    stat = runner.path.stat()
    template = runner.chat_template
    if template is None:
        # the header scanner: ~0.1 s where gguf.GGUFReader parsed the whole vocabulary in ~3 s
        template = gguf_metadata(runner.path, lambda key: key == TEMPLATE_KEY, until=1).get(TEMPLATE_KEY) or ""
    digest = hashlib.sha256(str(template).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return (f"{runner.path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:n_ctx={runner.n_ctx}:"
            f"n_parallel={runner.n_parallel}:resident={runner.resident}:template={digest}")


def remove_state(path: Path) -> None:
    """Remove a state file, or whatever took its place (a directory made at its name is damage
    too: refused like the others, never a 502 naming an internal path)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
