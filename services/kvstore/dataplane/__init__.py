"""The bulk TCP data plane of replication: framing, the target's listener and
receiver, the source's TCP target, pack pipeline and rate limit, and the
zero-copy segment views of a host pool."""
