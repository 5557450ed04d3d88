"""One embedding GGUF in an in-process llama.cpp server (xllamacpp, embedding mode): the local
stand-in for Workers AI's bge models, owned and stopped like the chat model's `LlamaCppRunner`.

llama.cpp pools (the GGUF says how: mean for MiniLM, as sentence-transformers does) and
L2-normalises each vector, so a cosine is a dot product. One sequence of at most `n_ctx` tokens
per text (BERT's 512 positions): a longer text is refused, never truncated, so a vector always
stands for the whole text it was asked for.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellm.ports import BindingError, InvalidModelInput

from edgellm_local.llama.embedded_server import start_server
from edgellm_local.llama.errors import public
from edgellm_local.llama.model_file import ModelFileError, gguf_metadata

_TOO_LARGE = re.compile(r"input \((\d+) tokens\) is too large")


@dataclass
class EmbeddingRunner:
    """Calls block; run them in threads. Safe to close at any time (its last call holds the server)."""

    path: Path
    n_ctx: int = 512  # BERT's position embeddings: the most tokens one text may have
    threads: int = max(1, os.cpu_count() or 1)
    _server: Any = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)

    def _serving(self) -> Any:
        with self._lock:
            if self._closed:
                raise BindingError("the llama.cpp embedding runner is stopped")
            if self._server is None:
                import xllamacpp

                params = xllamacpp.CommonParams()
                params.model.path = str(self.path)
                params.embedding = True
                params.n_ctx = params.n_batch = params.n_ubatch = self.n_ctx  # a whole text in one batch
                params.n_parallel = 1
                params.cpuparams.n_threads = self.threads
                params.cpuparams_batch.n_threads = self.threads
                params.verbosity = -1
                try:
                    self._server = start_server(params)
                except RuntimeError as exc:
                    raise ModelFileError(f"llama.cpp could not load the embedding model (truncated or corrupt GGUF?): {self.path}") from exc
            return self._server

    def load(self) -> "EmbeddingRunner":
        self._serving()
        return self

    def close(self) -> None:
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
        del server  # the last reference unless a call is still returning

    def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """(one vector per text, in order; the prompt tokens llama.cpp counted)."""
        server = self._serving()  # held until the call returns
        result = server.handle_embeddings({"input": list(texts)})
        error = result.get("error") if isinstance(result, dict) else None
        if error:
            message = str(error.get("message", error))
            too_large = _TOO_LARGE.search(message)
            if too_large:
                raise public(InvalidModelInput(f"5006: a text is {too_large.group(1)} tokens; this model embeds at most {self.n_ctx}"))
            raise BindingError(f"llama.cpp embeddings failed: {message}")
        rows = sorted(result["data"], key=lambda row: row["index"])
        return [row["embedding"] for row in rows], int((result.get("usage") or {}).get("prompt_tokens") or 0)

    @functools.cached_property
    def dimensions(self) -> int:
        """The vectors' dimension (`<arch>.embedding_length`), read from the GGUF's header once."""
        facts = gguf_metadata(self.path, lambda key: key == "general.architecture" or key.endswith(".embedding_length"))
        return int(facts[f"{facts['general.architecture']}.embedding_length"])
