"""The simulator's hot modules compiled with mypyc, in a private copy of the package.

A simulation spends its time in a couple of dozen pure-Python modules (the
engine model, the event loop, the kvstore and scheduler block indexes, the
load board, the router, scheduler core and planner, ...). mypyc compiles those
modules to C extensions: the same source, the same results (the parity test
compares every summary figure), about half the CPU (docs/performance.md). We
use mypyc (the compiler mypy itself is built with) rather than hand-written C
so the simulator keeps running the very objects the live services run.

The compiled modules never shadow the source tree: `build` writes a full copy
of the speckv package, with the extensions beside the copied sources, into
its own directory (default build/sim-compiled at the project root), and
`speckv simulate` puts that copy first on its *workers'* import path only.
The copy carries a stamp: a SHA-256 over every source file of the package
(and the Python and mypy versions). `current` accepts the copy only while the
stamp matches the source, so an edit to any module makes the workers fall
back to the source until the copy is rebuilt (`make sim-compiled`).

Records: mypyc leaves a dataclass-generated __init__ interpreted, so before
compiling, the build writes an explicit __init__ into every dataclass of the
copied hot modules (record_inits.py says the rule); the source keeps plain
dataclasses.

Building needs mypy (the `sim` extra) and a C compiler; it takes a few
minutes of CPU. Nothing here is imported by the live services (the stamp's
rules are services/common/compiled_code.py, which the scheduler reads too).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from speckv.loadgen.sim.record_inits import add_record_inits
from speckv.services.common.compiled_code import (  # the stamp's rules, shared with the scheduler's --compiled
    STAMP_FILE,
    PackageRoots,
    current,
    default_dir,
    is_compiled,
    mypy_version,
    source_digest,
    why_not_current,
)
from speckv.services.common.errors import FailedPrecondition

# Relative to the package root (speckv/). Every one is mypy-clean (mypyc
# refuses a module that does not type-check); each entry is a module whose own
# code showed in the profile of a 256-node run.
HOT_MODULES: tuple[str, ...] = (
    "loadgen/engines/emulated.py",
    "loadgen/engines/fast.py",
    "loadgen/experiments/replica_ledger.py",
    "loadgen/sim/event_loop.py",
    "loadgen/sim/failover.py",
    "loadgen/sim/kvnode.py",
    "loadgen/sim/membership.py",
    "loadgen/sim/network.py",
    "loadgen/sim/scheduler_side.py",
    "loadgen/sim/simulation.py",
    "loadgen/workload/scaled.py",
    "loadgen/workload/synthetic.py",
    "services/common/engine_profile.py",
    "services/common/retention.py",
    "services/common/traces/records.py",
    "services/kvstore/eviction.py",
    "services/kvstore/index.py",
    "services/predictor/serving/arrival_ring.py",
    "services/predictor/serving/core.py",
    "services/predictor/serving/observations.py",
    "services/scheduler/cluster.py",
    "services/scheduler/core.py",
    "services/scheduler/families.py",
    "services/scheduler/forecasts.py",
    "services/scheduler/holder_index.py",
    "services/scheduler/ports.py",
    "services/scheduler/views.py",
    "services/scheduler/policies/placement.py",
    "services/scheduler/replication/admission.py",
    "services/scheduler/replication/budgets.py",
    "services/scheduler/replication/lifecycle.py",
    "services/scheduler/orders.py",
    "services/scheduler/replication/family_options.py",
    "services/scheduler/replication/insurance.py",
    "services/scheduler/replication/outcomes.py",
    "services/scheduler/replication/planner.py",
    "services/scheduler/replication/redundancy.py",
    "services/scheduler/replication/retention_plan.py",
    "services/scheduler/replication/value.py",
    "services/scheduler/replication/replicas.py",
    "services/scheduler/replication/order_desk.py",
    "services/scheduler/routing/candidates.py",
    "services/scheduler/routing/confirmation.py",
    "services/scheduler/routing/disk_backlog.py",
    "services/scheduler/routing/join_ramp.py",
    "services/scheduler/routing/link_backlog.py",
    "services/scheduler/reuse_history.py",
    "services/scheduler/load_board.py",
    "services/scheduler/routing/route_records.py",
    "services/scheduler/routing/router.py",
)
# numpy, grpc and the like become Any: mypyc keeps them as Python objects, and
# the build takes seconds instead of the minutes of reading their stubs.
MYPY_FLAGS: tuple[str, ...] = ("--no-site-packages", "--ignore-missing-imports", "--follow-imports=silent")


def build(tree: Path, roots: PackageRoots, opt_level: str = "3", log=print) -> Path:
    """Copies the package into tree/speckv, compiles HOT_MODULES there and
    stamps it. The old build stays in place until the new one is complete."""
    if mypy_version() is None:
        raise FailedPrecondition("mypy is not installed: pip install -e '.[sim]' (make sim-compiled does)")
    digest = source_digest(roots)
    staging = tree.with_name(tree.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    copy_package(roots, staging)
    modules = [f"speckv/{m}" for m in HOT_MODULES]
    for module in modules:
        path = staging / module
        path.write_text(add_record_inits(path.read_text())[0])
    log(f"mypyc: compiling {len(modules)} modules in {staging} (a few minutes)")
    script = textwrap.dedent(f"""
        import sys
        from setuptools import setup
        from mypyc.build import mypycify
        sys.argv = ["setup.py", "-q", "build_ext", "--inplace"]
        setup(name="speckv-sim-compiled", ext_modules=mypycify(
            [*{list(MYPY_FLAGS)!r}, *{modules!r}], opt_level={opt_level!r}))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=staging, capture_output=True, text=True)
    if done.returncode != 0:
        (staging / "build.log").write_text(done.stdout + done.stderr)
        raise FailedPrecondition(f"mypyc failed (log: {staging / 'build.log'}):\n{(done.stdout + done.stderr)[-3000:]}")
    shutil.rmtree(staging / "build", ignore_errors=True)  # generated C and objects: hundreds of MB
    (staging / STAMP_FILE).write_text(json.dumps({"digest": digest, "modules": list(HOT_MODULES),
                                                   "python": sys.version, "mypy": mypy_version(),
                                                   "opt_level": opt_level}, indent=2))
    shutil.rmtree(tree, ignore_errors=True)
    staging.rename(tree)
    return tree


def copy_package(roots: PackageRoots, folder: Path) -> None:
    """The package's files into folder/speckv, laid out as imported."""
    for rel, path in roots.files():
        dest = folder / "speckv" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)


def running_compiled() -> bool:
    """Whether this process imported the simulation from a compiled build."""
    from speckv.loadgen.sim import simulation
    return is_compiled(simulation.__file__)


def main(argv: list[str]) -> int:
    """python -m speckv.loadgen.sim.compiled [build|check] [DIR]"""
    command = argv[0] if argv else "build"
    roots = PackageRoots.of_installed()
    tree = Path(argv[1]) if len(argv) > 1 else default_dir(roots)
    if command == "check":
        why = why_not_current(tree, roots)
        print(why or f"{tree} is current")
        return 0 if why is None else 1
    if command != "build":
        print(f"unknown command {command!r}: build or check", file=sys.stderr)
        return 2
    if current(tree, roots) is not None:
        print(f"{tree} is current: nothing to build")
        return 0
    build(tree, roots)
    print(f"compiled build written to {tree}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
