"""What an end-to-end comparison is made of: the reference router, the
committed e2e configuration, metrics, the TTFT floor, the replica ledger, the
KV-event follower, warm start and the report."""
