"""The one committed configuration of every policy and planner threshold
(services/config/policies.json), as frozen, validated records.

Every run (live cluster, simulator, benchmark) loads the same file, so a
number changed there changes it everywhere; the policy modules hold no
thresholds of their own. A missing key or a value out of range is
InvalidArgument naming `section.key`.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, TypeVar

from speckv.services.common.config import CONFIG_DIR
from speckv.services.common.errors import InvalidArgument
from speckv.services.scheduler.reuse_history import ReuseSettings

DEFAULT_POLICIES_PATH = CONFIG_DIR / "policies.json"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RouterSettings:
    spread_candidates: int  # least-loaded non-holders scored per route besides the holders
    join_ramp_s: float  # a node joining a serving cluster takes its share of misses over this long (0: at once)
    pending_stale_s: float  # routed work no queue report has counted for this long (s) starts draining (cluster.py)
    prefill_ahead_weight: float  # w of the router's prefill-ahead charge (router.py); 0: off
    prefill_ahead_budget_tokens: int  # B: the engines' chunked-prefill budget per step, tokens (router.py)


@dataclass(frozen=True, slots=True)
class FamilySettings:
    max_families: int  # families remembered (least recently routed forgotten first)
    max_chain_blocks: int  # longest shared prefix remembered per family, blocks
    heat_window_s: float  # routes counted as a family's heat within this window
    recent_window_s: float  # routes counted as a family's recent rate (FamilyCatalog.surging) within this window
    surge_min_routes: int  # a family surges while its routes within recent_window_s are at least this
    prompt_ewma_alpha: float  # weight of the newest prompt length in the family's mean


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    replica_lease_ms: int  # lease of a speculative order and of its replica once committed
    max_retries: int  # re-issues of a failed order from another source


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    link_budget_fraction: float  # share of a node's link speculation may use
    link_budget_window_s: float  # bytes in flight per link <= fraction * link rate * window
    replica_memory_fraction: float  # share of a node's pages speculative replicas may hold
    max_orders_per_tick: int


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    horizon_s: float  # forecast horizon the planner acts on
    demand: str  # "upper_quantile" or "expected_count": which forecast figure is the demand
    min_expected_requests: float  # families forecast below this are not considered
    min_return_probability: float  # conversations less likely to return within the horizon are not considered
    min_burst_probability: float
    max_families_per_tick: int
    plan_every_s: float  # the forecast-driven policies plan at most this often (s)
    candidates_per_family: int  # least-loaded non-holders priced as spill options and replica targets
    min_benefit_ms: float  # a node whose prefix saves less per request is not a holder
    min_net_ms: float  # an action is admitted only when its net saving exceeds this (ms)
    copy_ms_per_gib: float  # a copy's net is charged this many ms of TTFT per GiB it sends over the network
    insurance_life_s: float  # a replica is also valued against its family's next surge within this (s; 0: off)
    replicate: bool  # price replicas at all (off: prefetch and retain only; the simulator's ablation)
    replicate_to_device: bool  # also price replicas into a target's device tier (host tier always)
    prefetch: bool  # price host -> device promotions at holders ahead of forecast requests
    stage: bool  # price disk -> host staging at holders ahead of forecast requests (issue 44)
    queue_externality: bool  # charge an action the queueing the work it draws to a node adds to others routed there
    redundancy: bool  # price a second copy of a prefix with one holder against that holder failing
    failure_rate_per_node_hour: float  # unexpected failures per node (one engine) per hour; redundancy's P(fail)
    redundancy_min_saving_ms: float  # a redundant copy must be expected to save at least this much TTFT (ms)
    nowcast_min_routes: int  # predictive: families routed this often in families.recent_window_s get a nowcast (0: off)
    surge_replan_factor: float  # predictive: plan at once when a surge grew this much since the last plan (0: off)
    nowcast_lead_s: float  # predictive: a nowcast's horizon is horizon_s plus this (s), a copy's time to land (0: off)


@dataclass(frozen=True, slots=True)
class RetainSettings:
    enabled: bool  # the planner prices retain actions at all
    ttl_s: float  # a retain's lease: how long its blocks are kept (s), and the return forecast's window
    min_probability: float  # conversations less likely to return within ttl_s are not priced
    max_families: int  # at most this many families priced per tick, likeliest first
    max_per_tick: int  # at most this many retain orders per tick, largest net first
    pricing: str  # "uniform" (a return uniform over the window) or "curve" (the forecast's P(within t))
    displacement: str  # "once" (the pages' P(reuse) once) or "occupancy" (x the seconds held past d / reuse.window_s)


@dataclass(frozen=True, slots=True)
class HeatSettings:
    heat_threshold: int  # routes in the heat window that make a family hot
    heat_per_replica: int  # one more replica per this many routes in the window
    max_replicas: int  # holders a family may reach through fan-out
    action_cooldown_s: float  # no new copy of a family this soon after the last one
    recreate_after_s: float  # no new copy of a family this soon after one of its replicas was lost


@dataclass(frozen=True, slots=True)
class MigrateSettings:
    queue_threshold_ms: float  # a node whose queue exceeds this sheds its hottest family
    target_queue_below_ms: float  # only nodes queued under this receive it
    min_family_heat: int  # routes in the heat window for a family to be worth moving
    cooldown_s: float  # a family is not moved again within this time


@dataclass(frozen=True, slots=True)
class AffinitySettings:
    window_ms: float  # the batch window: placements made within it steer the requests that follow (ms)
    max_per_replica: int  # requests of one identical-prompt group per node within a window (-1: unlimited)
    min_colocate_tokens: int  # a leading prefix shared with a placed request that earns co-location (0: identical only)
    spill: str  # where a request with affinity goes when its nodes are full: "least_loaded" (llm-d) or "router"


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    router: RouterSettings
    families: FamilySettings
    leases: LeaseSettings
    budgets: BudgetSettings
    planner: PlannerSettings
    reactive_heat: HeatSettings
    reactive_migrate: MigrateSettings
    affinity: AffinitySettings
    reuse: ReuseSettings
    retain: RetainSettings
    source: str = ""

    def validate(self) -> None:
        _positive(self, "router.spread_candidates", "router.pending_stale_s", "families.max_families",
                  "families.max_chain_blocks", "families.heat_window_s", "families.recent_window_s",
                  "leases.replica_lease_ms",
                  "budgets.link_budget_window_s",
                  "budgets.max_orders_per_tick", "planner.horizon_s",
                  "planner.max_families_per_tick", "planner.candidates_per_family",
                  "reactive_heat.heat_threshold", "reactive_heat.heat_per_replica", "reactive_heat.max_replicas",
                  "reactive_heat.action_cooldown_s", "reactive_heat.recreate_after_s",
                  "reactive_migrate.queue_threshold_ms", "reactive_migrate.min_family_heat",
                  "reuse.window_s", "reuse.halflife_s", "reuse.max_ghosts", "reuse.prior_weight",
                  "retain.ttl_s", "retain.max_families", "retain.max_per_tick")
        _fraction(self, "families.prompt_ewma_alpha", "budgets.link_budget_fraction",
                  "budgets.replica_memory_fraction", "planner.min_burst_probability", "reuse.prior_p",
                  "planner.min_return_probability", "retain.min_probability")
        _finite_not_negative(self, "router.prefill_ahead_weight")
        _positive(self, "router.prefill_ahead_budget_tokens")
        if self.router.join_ramp_s < 0:
            raise InvalidArgument(f"router.join_ramp_s={self.router.join_ramp_s} must be >= 0")
        if self.planner.plan_every_s < 0:
            raise InvalidArgument(f"planner.plan_every_s={self.planner.plan_every_s} must be >= 0")
        factor = self.planner.surge_replan_factor
        if not (math.isfinite(factor) and (factor == 0 or factor > 1)):
            raise InvalidArgument(f"planner.surge_replan_factor={factor} must be 0 (off) or > 1")
        if self.planner.min_net_ms < 0:
            raise InvalidArgument(f"planner.min_net_ms={self.planner.min_net_ms} must be >= 0")
        if self.families.surge_min_routes < 1:
            raise InvalidArgument(f"families.surge_min_routes={self.families.surge_min_routes} must be >= 1")
        _finite_not_negative(self, "planner.insurance_life_s", "planner.copy_ms_per_gib", "planner.nowcast_lead_s",
                             "planner.failure_rate_per_node_hour", "planner.redundancy_min_saving_ms")
        if self.retain.pricing not in ("uniform", "curve"):
            raise InvalidArgument(f"retain.pricing={self.retain.pricing!r}: uniform or curve")
        if self.retain.displacement not in ("once", "occupancy"):
            raise InvalidArgument(f"retain.displacement={self.retain.displacement!r}: once or occupancy")
        if self.planner.demand not in ("upper_quantile", "expected_count"):
            raise InvalidArgument(f"planner.demand={self.planner.demand!r}: upper_quantile or expected_count")
        if self.reactive_migrate.target_queue_below_ms >= self.reactive_migrate.queue_threshold_ms:
            raise InvalidArgument("reactive_migrate.target_queue_below_ms must be below queue_threshold_ms")
        a = self.affinity
        if not (math.isfinite(a.window_ms) and 0 < a.window_ms <= 10000):
            raise InvalidArgument(f"affinity.window_ms={a.window_ms} must be in (0, 10000] (llm-d's bound)")
        if a.max_per_replica == 0 or a.max_per_replica < -1:
            raise InvalidArgument(f"affinity.max_per_replica={a.max_per_replica} must be -1 (unlimited) or >= 1")
        if a.spill not in ("least_loaded", "router"):
            raise InvalidArgument(f"affinity.spill={a.spill!r}: least_loaded or router")
        if a.min_colocate_tokens < 0:
            raise InvalidArgument(f"affinity.min_colocate_tokens={a.min_colocate_tokens} must be >= 0")


_SECTIONS: dict[str, type] = {"router": RouterSettings, "families": FamilySettings, "leases": LeaseSettings,
                              "budgets": BudgetSettings, "planner": PlannerSettings,
                              "reactive_heat": HeatSettings, "reactive_migrate": MigrateSettings,
                              "affinity": AffinitySettings, "reuse": ReuseSettings, "retain": RetainSettings}


def load_policy_config(path: Path | str | None = None) -> PolicyConfig:
    source = Path(path) if path else DEFAULT_POLICIES_PATH
    try:
        raw = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"policy configuration {source}: {exc}") from None
    sections = {name: _section(name, cls, raw.get(name)) for name, cls in _SECTIONS.items()}
    config = PolicyConfig(**sections, source=str(source))
    config.validate()
    return config


def _section(name: str, cls: type[T], raw: Any) -> T:
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"policy configuration: section {name!r} is missing")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            raise InvalidArgument(f"policy configuration: {name}.{f.name} is missing")
        # A string under postponed annotations; the class itself in a module
        # compiled by mypyc (reuse_history.ReuseSettings in the simulator's build).
        kind = f.type if isinstance(f.type, type) else {"int": int, "float": float, "str": str, "bool": bool}[f.type]
        if kind is bool:
            if not isinstance(raw[f.name], bool):
                raise InvalidArgument(f"policy configuration: {name}.{f.name}={raw[f.name]!r} "
                                      "is not true or false")
            values[f.name] = raw[f.name]
            continue
        try:
            values[f.name] = kind(raw[f.name])
        except (TypeError, ValueError):
            raise InvalidArgument(f"policy configuration: {name}.{f.name}={raw[f.name]!r} is not {kind.__name__}") from None
    return cls(**values)


def _get(config: PolicyConfig, dotted: str) -> float:
    section, key = dotted.split(".")
    return getattr(getattr(config, section), key)


def _positive(config: PolicyConfig, *names: str) -> None:
    for name in names:
        if not _get(config, name) > 0:
            raise InvalidArgument(f"policy configuration: {name}={_get(config, name)} must be > 0")


def _finite_not_negative(config: PolicyConfig, *names: str) -> None:
    for name in names:
        value = _get(config, name)
        if not (math.isfinite(value) and value >= 0):
            raise InvalidArgument(f"policy configuration: {name}={value} must be finite and >= 0")


def _fraction(config: PolicyConfig, *names: str) -> None:
    for name in names:
        if not 0 <= _get(config, name) <= 1:
            raise InvalidArgument(f"policy configuration: {name}={_get(config, name)} must be in [0, 1]")
