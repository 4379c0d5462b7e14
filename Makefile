# Two commands do everything on a fresh machine:
#   make repro   set up, then run the DVC pipeline on params.yaml (the embedded default profile)
#   make test    set up, then run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU machine takes torch's CPU build first, so no CUDA wheels are pulled in; override for GPUs.
TORCH_SPEC ?= $(if $(shell command -v nvidia-smi 2>/dev/null),torch,torch==2.13.0)
EXTRAS ?= dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SWORD_MODULES := $(addprefix /usr/share/sword/mods.d/,engWEB2015eb.conf spaRV1909eb.conf engKJV2006eb.conf)
STAMP := $(VENV)/.installed-$(EXTRAS)

.PHONY: setup corpus repro test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[$(EXTRAS)]"
	touch $@

# The corpora: World English Bible, Reina-Valera 1909 and King James Version SWORD modules (Debian packages).
corpus:
	@for f in $(SWORD_MODULES); do [ -f $$f ] || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing SWORD modules (sword-text-web sword-text-sparv sword-text-kjv)"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q sword-text-web sword-text-sparv sword-text-kjv; \
	fi

repro: setup corpus
	PATH="$(abspath $(VENV))/bin:$$PATH" dvc repro

# The suite runs on TEST_WORKERS processes (pytest-xdist), whole files to a worker so module fixtures are
# built once; one intra-op thread each, so the workers never contend for the cores. Files go out in the
# order tests/conftest.py gives them (the minutes-long end-to-end runs first), not xdist's own.
TEST_WORKERS ?= 2

test: setup corpus
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: setup
	$(VENV)/bin/ruff check pipeline stages attention_kernels benchmarks tests

clean:
	rm -rf $(VENV)
