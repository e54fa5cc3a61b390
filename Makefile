# Two commands on a fresh machine (both install whatever is missing first):
#   make gallery   build gallery/ from the zoo's diagrams
#   make test      run the test suite
PYTHON ?= python3
STAMP := .setup-done

.PHONY: setup gallery test bench

$(STAMP): pyproject.toml tools/setup.sh
	bash tools/setup.sh
	touch $(STAMP)

setup: $(STAMP)

gallery: $(STAMP)
	$(PYTHON) -m penrose.cli gallery -o gallery

test: $(STAMP)
	$(PYTHON) -m pytest -q

bench: $(STAMP)
	$(PYTHON) bench/compile_overhead.py
