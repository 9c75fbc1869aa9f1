"""The scheduler: its pure core at this level (cluster, block index, families,
forecasts, views, core facade) with routing/, policies/ and replication/, and
its gRPC, ZMQ and SQLite edges in adapters/."""
