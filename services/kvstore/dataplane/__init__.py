"""The bulk TCP transport of replication, above the store: framing, the
target's listener and receiver, and the source's TCP target. What every
transport moves bytes with (zero-copy segments, the pack pipeline, the rate
limit) lives in the kvstore package itself, so the store never imports this."""
