"""Writes a trained LightGBM forecaster as a model directory (the layout
lgbm_served.py reads and documents): the booster files, their compiled
libraries, then the manifest, atomically and last.
"""
from __future__ import annotations

from pathlib import Path

from speckv.services.predictor.serving import compiled_trees
from speckv.services.predictor.serving.burst_choice import BURST_KIND
from speckv.services.predictor.serving.lgbm_bundle import KINDS, LEVEL_FREE_KIND, LevelOffset
from speckv.services.predictor.serving.lgbm_served import LightGbmModel
from speckv.services.predictor.serving.manifest import write_manifest


def save_model(directory: str | Path, model: LightGbmModel, compile_trees: bool = True) -> Path:
    """Writes the booster files, their compiled libraries (compiled_trees.py;
    with compile_trees, else the manifest says they were not asked for),
    then the manifest (atomically, last)."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[str]] = {}
    bundle = model.bundle
    for kind in (*KINDS, LEVEL_FREE_KIND, BURST_KIND):
        if kind not in bundle.boosters:
            continue
        files[kind] = []
        for h, booster in zip(model.horizons_s, bundle.boosters[kind]):
            name = f"{kind}_h{h:g}.txt"
            booster.save_model(str(target / name))
            files[kind].append(name)
    manifest = {
        "kind": "lightgbm", "version": model.version, "horizons_s": list(model.horizons_s),
        "quantile": model.quantile, "metrics": model.metrics, "features": list(model.features),
        "feature_spec": bundle.spec.to_dict(), "alarm_threshold": list(bundle.alarm_threshold),
        "dispersion": list(bundle.dispersion), "offset": _offset_dict(bundle.offset),
        "trace": model.trace, "files": files,
        "compiled": (compiled_trees.build(target, files, model.horizons_s) if compile_trees
                     else {"unavailable": "not asked for when the model was written"})}
    if bundle.selection is not None and bundle.baselines is not None:
        manifest["point"] = {"baselines": {"ewma_halflife_s": bundle.baselines.ewma_halflife_s,
                                           "period_steps": bundle.baselines.period_steps},
                             "selection": bundle.selection.to_dict()}
    if bundle.burst is not None and BURST_KIND in bundle.boosters:
        manifest["burst"] = bundle.burst.to_dict()
    return write_manifest(target, manifest)


def _offset_dict(offset: LevelOffset) -> dict[str, float]:
    return {"halflife_s": offset.halflife_s, "prior_per_step": offset.prior_per_step,
            "prior_steps": offset.prior_steps}
