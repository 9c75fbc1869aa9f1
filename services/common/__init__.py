"""The domain vocabulary every service and the lab share (ids, clock, errors, geometry, tiers, retention, the cost model, config, traces); gRPC plumbing is common/rpc/."""
