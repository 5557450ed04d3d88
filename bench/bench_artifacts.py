"""Artifacts benchmark: `edgellm pull` against curl, aria2c -x8 and a naive in-memory loop, in one run.

Publishes a large model file (default 1 GiB: a real tiny GGUF padded with random bytes) with
`edgellm publish --target local`, starts the edge (`edgellm dev`) on that state in its own
process, then downloads the model's shards from it three ways, each a process of its own whose
peak memory is its kernel high-water mark (VmHWM, sampled from /proc while it runs):
- curl: the whole GGUF from its Hugging Face URL (`/models/{name}/resolve/main/model.gguf`, the
  shards streamed in order by the edge), one stream, into a file, verifying nothing;
- aria2c -x8 -s8: the same URL over 8 connections of Range requests (skipped, with a message, when
  aria2c is not installed: `make bench` installs Debian's aria2);
- naive: Python httpx, one shard after another into memory (`.content`), then written to a file;
- pull: `edgellm pull --parallel N` (writes the GGUF, verifies every shard's SHA-256 as it arrives).
All write the model to disk; only pull verifies it, so a "curl + openssl sha256" row shows what
checking curl's file once would add. Timings include process start-up.
Targets: pull, verifying, at least 0.9x curl and 1.5x aria2c -x8, at under 100 MB peak RSS.
Figures from a shared, busy 2-core machine vary from run to run: compare ratios within one run.

    .venv/bin/python -m bench.bench_artifacts [--size 1GiB] [--shard-size 64MiB] [--parallel 4] [--also-parallel 1] [--rounds 1]

`--serving-cpu` measures only what serving costs the server: the edge's CPU seconds per
GiB of shards served (user + system, from /proc), for an edge running `--before DIR` (another
version's `src/` and `local/`, e.g. `git archive <commit> src local`) beside one running this
checkout and beside nginx (`sendfile on`) serving the same shard files, in alternating rounds, each
round one curl fetching every shard in turn; medians printed with the ratios. An "edge chunked" row
(this checkout under `edgellm dev --no-sendfile`) is the same-code baseline for sendfile(2).

    .venv/bin/python -m bench.bench_artifacts --serving-cpu [--before DIR] [--cpu-rounds 5]

`--also-parallel` adds a second pull row: on loopback, where there is no latency to hide, one
stream competes less with the edge for the CPU; the targets are judged on `--parallel`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


from bench.edge_process import cpu_seconds, free_port, running_edge
from edgellm_local.hub.publish import parse_size
from edgellm_local.emulator.r2 import FileR2
from tests.support.tiny_gguf import write_tiny_gguf

NAME = "bench-model"
MB = 1_000_000
NAIVE = """
import sys, httpx
out, urls = sys.argv[1], sys.argv[2:]
with httpx.Client(timeout=120, headers={"Accept-Encoding": "identity"}) as client, open(out, "wb") as f:
    for url in urls:
        r = client.get(url)
        r.raise_for_status()
        f.write(r.content)
"""


def write_model(path: Path, size: int) -> None:
    """A GGUF header and metadata (a real tiny model), then random bytes up to `size`."""
    write_tiny_gguf(path, vocab="bpe")
    with open(path, "ab") as f:
        left = size - path.stat().st_size
        while left > 0:
            f.write(os.urandom(min(left, 1 << 20)))
            left -= 1 << 20


def publish(state: Path, model: Path, shard_size: int) -> dict:
    """`edgellm publish --target local` into `state`, then the manifest it wrote."""
    command = [sys.executable, "-m", "edgellm_local.cli", "publish", str(model), "--name", NAME,
               "--shard-size", str(shard_size), "--target", "local", "--state", str(state)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    r2 = FileR2(state / "r2")

    async def read() -> bytes:
        obj = await r2.get(f"models/{NAME}/manifest.json")
        assert obj is not None and obj.body is not None
        return b"".join([chunk async for chunk in obj.body])

    try:
        return json.loads(asyncio.run(read()))
    finally:
        r2.close()


@dataclass(frozen=True)
class Run:
    label: str
    seconds: float
    bytes: int
    peak_rss: int  # bytes

    @property
    def rate(self) -> float:
        return self.bytes / self.seconds / MB


def high_water_mark(pid: int) -> int | None:
    """The process's peak resident set (VmHWM) in bytes; None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def measure(label: str, command: list[str], size: int, stdout: Path | None = None) -> Run:
    """Run `command`, timing it and sampling its VmHWM every 5 ms (monotonic, so the last sample
    before exit is the peak to within the last few ms). `wait4`'s ru_maxrss is no use here: it
    starts from the forking parent's own high-water mark."""
    with open(stdout or os.devnull, "wb") as out:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE)
        peak = 0
        while process.poll() is None:
            peak = max(peak, high_water_mark(process.pid) or 0)
            time.sleep(0.005)
        seconds = time.perf_counter() - start
    err = process.stderr.read() if process.stderr else b""
    if process.returncode != 0:
        raise RuntimeError(f"{label} failed ({process.returncode}): {err.decode(errors='replace')[-2000:]}")
    return Run(label, seconds, size, peak)


NGINX_CONF = """
{user}daemon off; worker_processes 1; error_log {root}/nginx-error.log; pid {root}/nginx.pid;
events {{ worker_connections 64; }}
http {{
  access_log off; sendfile on; tcp_nopush on; default_type application/octet-stream;
  client_body_temp_path {root}/nginx-tmp; proxy_temp_path {root}/nginx-tmp; fastcgi_temp_path {root}/nginx-tmp;
  uwsgi_temp_path {root}/nginx-tmp; scgi_temp_path {root}/nginx-tmp;
  server {{ listen 127.0.0.1:{port}; root {files}; }}
}}
"""


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of `pid` and its children (nginx's master and its worker)."""
    total = cpu_seconds(pid)
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            total += sum(cpu_seconds(int(child)) for child in f.read().split())
    return total


@contextlib.contextmanager
def running_nginx(root: Path, files: Path) -> Iterator[tuple[str, int]]:
    """nginx serving `files` (sendfile on), as the reference for what bytes should cost; yields
    (URL, master pid)."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    port = free_port()
    (root / "nginx-tmp").mkdir(exist_ok=True)
    conf = root / "nginx.conf"
    # as root its worker would run as nobody, who cannot read the bench's private temporary directory
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf.write_text(NGINX_CONF.format(user=user, root=root, port=port, files=files))
    process = subprocess.Popen([nginx, "-c", str(conf), "-p", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"nginx exited: {(root / 'nginx-error.log').read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.05)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(10)


def fetch_all(urls: list[str]) -> tuple[int, float]:
    """One curl fetching every URL in turn into /dev/null: (bytes received, seconds)."""
    command = ["curl", "--silent", "--show-error", "--fail", "-H", "Accept-Encoding: identity", "-w", "%{size_download}\\n"]
    for url in urls:
        command += ["-o", "/dev/null", url]
    start = time.perf_counter()
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return sum(int(n) for n in out.split()), time.perf_counter() - start


def serving_cpu(args: argparse.Namespace, root: Path, state: Path, tiny: Path, manifest: dict, size: int) -> int:
    """The `--serving-cpu` phase (see the module doc)."""
    with contextlib.ExitStack() as stack:
        pids: dict[str, int] = {}
        targets: dict[str, tuple[list[str], int]] = {}
        if shutil.which("nginx") or os.path.exists("/usr/sbin/nginx"):
            data = state / "r2" / "data"
            url, pid = stack.enter_context(running_nginx(root, data))
            shard_sizes = sorted(s["size"] for s in manifest["shards"])
            files = [p.name for p in data.iterdir() if p.stat().st_size in shard_sizes][: len(shard_sizes)]
            targets["nginx (sendfile)"] = ([f"{url}/{name}" for name in files], pid)
        else:
            print("nginx is not installed: no reference row (`apt-get install nginx-light`)")
        if args.before:
            url = stack.enter_context(running_edge(tiny, state, code=args.before, pids=pids))
            targets["edge before"] = ([f"{url}/models/{NAME}/{s['path']}" for s in manifest["shards"]], pids[url])
        if args.chunked_row:  # this checkout with sendfile off: the chunked path, same code otherwise
            url = stack.enter_context(running_edge(tiny, state, extra=["--no-sendfile"], pids=pids))
            targets["edge chunked"] = ([f"{url}/models/{NAME}/{s['path']}" for s in manifest["shards"]], pids[url])
        url = stack.enter_context(running_edge(tiny, state, pids=pids))
        targets["edge after"] = ([f"{url}/models/{NAME}/{s['path']}" for s in manifest["shards"]], pids[url])
        for urls, _pid in targets.values():
            fetch_all(urls)  # warm: the page cache, and each server's first requests
        per_gib: dict[str, list[float]] = {k: [] for k in targets}
        rate: dict[str, list[float]] = {k: [] for k in targets}
        names = list(targets)
        for i in range(args.cpu_rounds):
            for name in names if i % 2 == 0 else names[::-1]:
                urls, pid = targets[name]
                before = process_tree_cpu(pid)
                got, seconds = fetch_all(urls)
                used = process_tree_cpu(pid) - before
                assert got == size, (name, got, size)
                per_gib[name].append(used / (got / (1 << 30)))
                rate[name].append(got / seconds / MB)
    load = os.getloadavg()
    print(f"\nserver CPU per GiB served, {size:,} bytes a round as {len(manifest['shards'])} shards, one curl, "
          f"median of {args.cpu_rounds} alternating rounds (load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}):")
    print(f"{'server':<20}{'CPU s/GiB':>11}{'min':>8}{'max':>8}{'MB/s':>9}")
    median = {k: statistics.median(v) for k, v in per_gib.items()}
    for name in names:
        print(f"{name:<20}{median[name]:>11.3f}{min(per_gib[name]):>8.3f}{max(per_gib[name]):>8.3f}{statistics.median(rate[name]):>9.0f}")
    after = median["edge after"]
    if "edge before" in median:
        print(f"edge after / before:  {after / median['edge before']:.2f}x CPU per GiB")
    if "edge chunked" in median:
        print(f"edge after / chunked: {after / median['edge chunked']:.2f}x CPU per GiB")
    if "nginx (sendfile)" in median:
        ref = median["nginx (sendfile)"]
        if "edge chunked" in median:
            print(f"edge chunked / nginx: {median['edge chunked'] / ref:.1f}x")
        if "edge before" in median:
            print(f"edge before / nginx:  {median['edge before'] / ref:.1f}x")
        print(f"edge after / nginx:   {after / ref:.1f}x   (target <= 3x)")
        return 0 if after <= 3 * ref else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="model size (default 1GiB)")
    parser.add_argument("--shard-size", type=parse_size, default=64 << 20, help="shard size (default 64MiB)")
    parser.add_argument("--parallel", type=int, default=4, help="pull's concurrent shard downloads (the targets' row)")
    parser.add_argument("--also-parallel", type=int, default=1, help="a second pull row with this --parallel (0: none)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat each download; the best round counts")
    parser.add_argument("--serving-cpu", action="store_true", help="only the server-CPU-per-GiB comparison (see the module doc)")
    parser.add_argument("--before", help="with --serving-cpu: a directory holding another version's src/ and local/")
    parser.add_argument("--chunked-row", action=argparse.BooleanOptionalAction, default=True,
                        help="with --serving-cpu: also this checkout with `--no-sendfile` (the chunked path), default on")
    parser.add_argument("--cpu-rounds", type=int, default=5, help="with --serving-cpu: alternating rounds (median)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="edgellm-bench-artifacts-") as tmp:
        root = Path(tmp)
        model, state = root / "source.gguf", root / "state"
        tiny = write_tiny_gguf(root / "tiny.gguf", vocab="bpe")
        write_model(model, args.size)
        t = time.perf_counter()
        manifest = publish(state, model, args.shard_size)
        print(f"published {args.size:,} bytes as {len(manifest['shards'])} shards of {args.shard_size:,} in {time.perf_counter() - t:.1f} s")
        if args.serving_cpu:
            return serving_cpu(args, root, state, tiny, manifest, args.size)
        aria2c = shutil.which("aria2c")
        if aria2c is None:
            print("aria2c is not installed: skipping its row (`apt-get install aria2`; `make bench` does)")
        runs: dict[str, list[Run]] = {"curl": [], "curl+sha": [], "naive": [], "pull": []}
        if args.also_parallel and args.also_parallel != args.parallel:
            runs["pull-also"] = []
        if aria2c:
            runs["aria2c"] = []
        with running_edge(tiny, state) as url:
            urls = [f"{url}/models/{NAME}/{s['path']}" for s in manifest["shards"]]
            whole = f"{url}/models/{NAME}/resolve/main/model.gguf"
            curl = ["curl", "--silent", "--show-error", "--fail", "-H", "Accept-Encoding: identity", whole]
            for round_ in range(args.rounds):
                if aria2c:
                    target = root / "aria2"
                    command = [aria2c, "-x8", "-s8", "-k1M", "--quiet=true", "--allow-overwrite=true", "--auto-file-renaming=false",
                               "--file-allocation=none", "-d", str(target), "-o", "model.gguf", whole]
                    runs["aria2c"].append(measure("aria2c -x8 -s8", command, args.size))
                    assert (target / "model.gguf").stat().st_size == args.size
                    shutil.rmtree(target)
                fetched = root / "curl.gguf"
                runs["curl"].append(measure("curl (one stream)", curl, args.size, stdout=fetched))
                check = measure("sha256", ["openssl", "dgst", "-sha256", str(fetched)], args.size)
                runs["curl+sha"].append(Run("curl + openssl sha256", runs["curl"][-1].seconds + check.seconds, args.size, max(runs["curl"][-1].peak_rss, check.peak_rss)))
                fetched.unlink()
                runs["naive"].append(measure("naive (in memory)", [sys.executable, "-c", NAIVE, str(root / "naive.bin"), *urls], args.size))
                (root / "naive.bin").unlink()
                out = root / f"pulled-{round_}"
                pull = [sys.executable, "-m", "edgellm_local.cli", "pull", url, NAME, "--out", str(out), "--parallel", str(args.parallel)]
                runs["pull"].append(measure(f"edgellm pull (parallel {args.parallel})", pull, args.size))
                assert (out / "model.gguf").stat().st_size == args.size
                (out / "model.gguf").unlink()
                if "pull-also" in runs:
                    pull[-1] = str(args.also_parallel)
                    runs["pull-also"].append(measure(f"edgellm pull (parallel {args.also_parallel})", pull, args.size))
                    (out / "model.gguf").unlink()
    best = {k: min(v, key=lambda r: r.seconds) for k, v in runs.items()}
    print(f"\n{'download (best of ' + str(args.rounds) + ')':<28} {'seconds':>8} {'MB/s':>8} {'peak RSS MB':>12}")
    for run in best.values():
        print(f"{run.label:<28} {run.seconds:>8.2f} {run.rate:>8.1f} {run.peak_rss / MB:>12.1f}")
    pull, curl, naive = best["pull"], best["curl"], best["naive"]
    print(f"\npull / curl throughput:  {pull.rate / curl.rate:.2f}x   (target >= 0.9, pull verifying, curl not)")
    met = pull.rate >= 0.9 * curl.rate and pull.peak_rss < 100 * MB
    if "aria2c" in best:
        ratio = pull.rate / best["aria2c"].rate
        print(f"pull / aria2c -x8:       {ratio:.2f}x   (target >= 1.5)")
        met = met and ratio >= 1.5
    if "pull-also" in best:
        also = best["pull-also"]
        print(f"pull --parallel {args.also_parallel} / curl: {also.rate / curl.rate:.2f}x"
              + (f", / aria2c -x8: {also.rate / best['aria2c'].rate:.2f}x" if "aria2c" in best else ""))
    print(f"pull / naive throughput: {pull.rate / naive.rate:.2f}x")
    print(f"pull peak memory:        {pull.peak_rss / MB:.1f} MB   (target < 100 MB; naive {naive.peak_rss / MB:.1f} MB, {naive.peak_rss / pull.peak_rss:.1f}x pull's)")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
