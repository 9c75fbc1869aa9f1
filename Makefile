# Set-up on a fresh machine is one command each: `make demo`, `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BASE_STAMP := $(VENV)/.installed-base
TRACES ?= $(or $(SPECKV_TRACES),../shared/traces)
PROTOS := $(wildcard protos/speckv/v1/*.proto)

.PHONY: venv protos check-protos test demo up kernels sim-compiled clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip setuptools wheel

# -qq: pip prints errors only (a build backend's warnings, such as setuptools'
# note on editable installs, are not the user's concern on a first run).
# Reinstall when the dependency list changes. The lab extra (the load
# generator, simulator, benches and demo: torch, matplotlib, statsmodels) for
# the tests of the lab; the ray extra too, so that CI runs speckv simulate
# --ray's test (tests/unit/loadgen/sim/test_ray_pool.py). The demo and `up`
# need the lab extra alone, none of the others (test tools, mypy, Ray), so a
# fresh machine's first `make demo` does not wait for them; a later `make test`
# adds them. The service image (Dockerfile) installs the package with no extra.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -qq -e '.[test,sim,ray,lab]'
	touch $(STAMP) $(BASE_STAMP)

$(BASE_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -qq -e '.[lab]'
	touch $(BASE_STAMP)

venv: $(STAMP)

# Stubs are generated next to the protos so they import as speckv.v1.*_pb2.
protos: $(STAMP)
	$(PY) -m grpc_tools.protoc -I protos --python_out=protos --grpc_python_out=protos --pyi_out=protos $(PROTOS)

# Fails when the committed stubs differ from what the protos generate.
check-protos: $(STAMP)
	@tmp=$$(mktemp -d) && \
	$(PY) -m grpc_tools.protoc -I protos --python_out=$$tmp --grpc_python_out=$$tmp --pyi_out=$$tmp $(PROTOS) && \
	for f in $$tmp/speckv/v1/*.py*; do \
	  diff -q $$f protos/speckv/v1/$$(basename $$f) >/dev/null || { echo "stale generated stub: protos/speckv/v1/$$(basename $$f) (run make protos)"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp; echo "generated stubs are current"

kernels:
	@if command -v nvcc >/dev/null; then \
	  for f in $$(find kernels -name '*.cu'); do nvcc --ptx -arch=sm_90 -o /dev/null $$f || exit 1; echo "nvcc ok: $$f"; done; \
	else echo "nvcc not found: kernel sources not compiled"; fi

# The simulator's hot modules compiled with mypyc into build/sim-compiled (a
# few minutes); speckv simulate uses them while they match the source.
sim-compiled: $(STAMP)
	$(PY) -m speckv.loadgen.sim.compiled build

test: $(STAMP) check-protos
	$(PY) -m pytest -q

# Without the trace in $(TRACES) (or with TRACES empty) the demo runs on its
# synthetic default and says how to get the trace.
demo: $(BASE_STAMP)
	$(VENV)/bin/speckv demo $(if $(TRACES),--traces $(TRACES))

up: $(BASE_STAMP)
	$(VENV)/bin/speckv up --nodes 3

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
