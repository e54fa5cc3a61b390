# Two commands on a fresh machine (both install whatever is missing first):
#   make gallery   build gallery/ from the zoo's diagrams
#   make test      run the test suite
# Everything runs in the activated virtual/conda environment if there is one, else in .venv/.
ifneq ($(VIRTUAL_ENV),)
ENV := $(VIRTUAL_ENV)
else ifneq ($(CONDA_PREFIX),)
ENV := $(CONDA_PREFIX)
else
ENV := .venv
endif
PYTHON := $(ENV)/bin/python
STAMP := $(ENV)/.penrose-setup-done
GALLERY_OUT ?= gallery

.PHONY: setup gallery test bench dist lint

$(STAMP): pyproject.toml tools/setup.sh
	bash tools/setup.sh
	touch $(STAMP)

setup: $(STAMP)

gallery: $(STAMP)
	$(PYTHON) -m penrose.cli gallery -o $(GALLERY_OUT)

# in parallel, a worker per core up to 4 (pytest-xdist; tests/conftest.py: threads per worker)
test: $(STAMP)
	$(PYTHON) -m pytest -q -n auto --maxprocesses 4

bench: $(STAMP)
	$(PYTHON) bench/compile_overhead.py

lint: $(STAMP)
	$(PYTHON) -m ruff check penrose zoo tests bench tools
	$(PYTHON) -m mypy

dist: $(STAMP)
	$(PYTHON) -m build --outdir dist .
