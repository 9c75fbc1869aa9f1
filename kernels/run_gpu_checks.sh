#!/usr/bin/env bash
# GPU checks in one go, for a machine with a CUDA device (a lent H200 with
# CUDA 13 and cupy-cuda13x), run from anywhere in the repository:
#
#   bash kernels/run_gpu_checks.sh
#
# 1. environment: python, numpy, cupy, torch, nvcc, the device;
# 2. makes speckv.* importable without installing anything (a folder of links
#    mirroring pyproject's package-dir) unless it already is; wheels under
#    .whl/ (e.g. protobuf, when the machine's is older than the generated
#    stubs need) are installed into a private folder first;
# 3. pytest: tests/gpu plus the kernel and pool unit tests;
# 4. the GPU benchmark (speckv.kernels.bench), printed and written as JSON to
#    $OUT/gpu_bench.json ($OUT defaults to ./out);
# 5. the kvstore's tier moves (demote/promote through the staged copy) beside
#    a plain pinned host<->device copy, to $OUT/tier_moves.json;
# 6. the vLLM connector's page copies on CUDA pages (torch) beside a plain
#    host->device copy and memcpy, to $OUT/page_copy.json (its parity tests,
#    tests/gpu/test_connector_*_cuda.py, ran in step 3).
#
# Environment: PYTHON (default python3), OUT, BENCH_GEOMETRY (llama-3-8b),
# BENCH_BLOCKS (default: about 256 MiB of blocks). Every step runs; the exit
# status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=${OUT:-out}
mkdir -p "$RESULTS"
failed=0
step() { echo; echo "== $*"; }

step "environment"
if compgen -G ".whl/*.whl" >/dev/null; then
  site=$(mktemp -d)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
    && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" || failed=1
fi
if ! "$PY" -c "import speckv.kernels" 2>/dev/null; then
  shim=$(mktemp -d)
  mkdir -p "$shim/speckv"
  ln -s "$PWD/protos/speckv/__init__.py" "$shim/speckv/__init__.py"
  ln -s "$PWD/protos/speckv/v1" "$shim/speckv/v1"
  for part in services kernels loadgen; do ln -s "$PWD/$part" "$shim/speckv/$part"; done
  export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" - <<'EOF' || failed=1
import sys
import numpy, cupy
print("python", sys.version.split()[0], "| numpy", numpy.__version__, "| cupy", cupy.__version__)
try:
    import torch
    print("torch", torch.__version__, "| torch sees CUDA:", torch.cuda.is_available())
except ImportError:
    print("torch: not installed (the torch CUDA test will skip)")
count = cupy.cuda.runtime.getDeviceCount()
props = cupy.cuda.runtime.getDeviceProperties(0)
print("devices:", count, "| device 0:", props["name"].decode(), "| sm", f"{props['major']}.{props['minor']}",
      "| CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(), "| driver", cupy.cuda.runtime.driverGetVersion())
from speckv.kernels.backend_choice import select_backend
print("select_backend('auto'):", select_backend("auto").name)
try:
    import speckv.v1.common_pb2  # noqa: F401  (the pool tests need the generated stubs)
except Exception as error:
    print(f"WARNING: speckv.v1 stubs do not import ({error}); carry a matching protobuf wheel in .whl/")
EOF
command -v nvcc >/dev/null && nvcc --version | tail -1

step "pytest tests/gpu and the kernel/pool unit tests"
"$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu tests/unit/kernels tests/unit/services/kvstore/test_pool*.py \
  || failed=1

step "GPU benchmark -> $RESULTS/gpu_bench.json"
"$PY" -m speckv.kernels.bench --geometry "${BENCH_GEOMETRY:-llama-3-8b}" ${BENCH_BLOCKS:+--blocks "$BENCH_BLOCKS"} \
  --json "$RESULTS/gpu_bench.json" || failed=1

step "tier moves (CuPy device tier <-> pinned host tier) -> $RESULTS/tier_moves.json"
"$PY" - "$RESULTS/tier_moves.json" <<'EOF' || failed=1
import json, sys
from speckv.loadgen.bench.transfer.tiers import tier_moves
from speckv.services.common.geometry import preset
moves = tier_moves(preset("llama-3-8b"), 128, 5)
print(json.dumps(moves, indent=1))
open(sys.argv[1], "w").write(json.dumps(moves, indent=1))
EOF

step "connector page copies (vLLM's CUDA page layout) -> $RESULTS/page_copy.json"
"$PY" docs/scripts/page_copy_speed.py --json "$RESULTS/page_copy.json" || failed=1

step "done: $([ $failed = 0 ] && echo all steps passed || echo SOME STEP FAILED)"
exit $failed
