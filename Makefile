# Plain entry points: `make demo` and `make test` set everything up from nothing.
# torch is installed first, pinned, so pip never pulls a multi-GB CUDA build on a CPU machine.
VENV   ?= .venv
PYTHON ?= python3
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/semsearch index data/demo_faq.csv -o demo-index --text-field question,answer
	$(BIN)/semsearch info demo-index
	$(BIN)/semsearch query demo-index --queries data/demo_sample.txt -k 3

lint: $(STAMP)
	$(BIN)/ruff check .

# pytest exits 5 when it collects no test: that is a failure of the suite, said plainly.
test: $(STAMP) lint
	$(BIN)/python -m pytest -q -rs; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) demo-index .pytest_cache
