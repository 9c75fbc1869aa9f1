"""Workloads: open-loop trace replay, a trace scaled to any node count, and
the named synthetic scenarios (trace loaders live in speckv.services.common.traces)."""
