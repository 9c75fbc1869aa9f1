"""The chaos bench's cases, one module per area (identity, dataplane, limits, load, faults, membership)."""
