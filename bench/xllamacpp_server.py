"""llama.cpp's own server, as built by xllamacpp, in a process of its own: the stand-in peer
when no `llama-server` binary has been built (`--llama-server xllamacpp`). It is the same
server code (slots, `cache_prompt`, RAM prompt cache 8192 MiB and slot prompt similarity 0.1 by
default, as llama-server's), the edge's own llama.cpp build, with none of the edge around it.
`CACHE_RAM_MIB` bounds the RAM prompt cache (llama-server's `--cache-ram`; 8192 if not given), so
a replica can be made to hold only some of a workload's prompts, as a serving replica's bounded
KV cache does.

    python -m bench.xllamacpp_server MODEL CTX PARALLEL THREADS [CACHE_RAM_MIB]

prints its URL on a line of its own, then serves until stdin closes or it is terminated.
"""

from __future__ import annotations

import signal
import sys
import threading


def main(argv: list[str]) -> int:
    import xllamacpp

    from edgellm_local.llama.embedded_server import start_server

    model, ctx, parallel, threads = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    params = xllamacpp.CommonParams()
    params.model.path = model
    params.n_ctx = ctx
    params.n_parallel = parallel
    params.cache_ram_mib = int(argv[4]) if len(argv) > 4 else 8192
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.verbosity = -1
    server = start_server(params)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()  # the parent gone: stop
    print(f"URL {server.listening_address.rstrip('/')}", flush=True)
    stop.wait()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
