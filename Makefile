# Plain entry points: `make demo` and `make test` set everything up from nothing.
# torch is installed first, pinned, so pip never pulls a multi-GB CUDA build on a CPU machine.
# The demo needs the package alone; the tests also need the dev extra (pytest, ruff, the peer
# sentence-transformers, the server, Ray, the browser), installed only by `make test`.
VENV   ?= .venv
PYTHON ?= python3
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
BASE   := $(VENV)/.installed-base
DEV    := $(VENV)/.installed-dev

.PHONY: install demo test lint readme clean

$(BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e .
	touch $(BASE)

$(DEV): $(BASE)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(DEV)

install: $(DEV)

demo: $(BASE)
	$(BIN)/semsearch index data/demo_faq.csv -o demo-index --text-field question --also question,answer
	$(BIN)/semsearch info demo-index
	$(BIN)/semsearch query demo-index --queries data/demo_sample.txt -k 3

lint: $(DEV)
	$(BIN)/ruff check .

# Runs every README example in order in a temporary directory and rewrites the outputs the README
# shows (its console blocks) from what their commands print today; `--check` only compares.
readme: $(DEV)
	$(BIN)/python -m tests.readme_examples

# pytest exits 5 when it collects no test: that is a failure of the suite, said plainly.
test: $(DEV) lint
	$(BIN)/python -m pytest -q -rs; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) demo-index .pytest_cache
