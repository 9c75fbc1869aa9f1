"""NIXL transport of the kvstore: the agent adapter, descriptor layout and replication target."""
