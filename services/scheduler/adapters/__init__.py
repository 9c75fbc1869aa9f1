"""The scheduler's adapters: its gRPC servicer, server and process config, the
gRPC clients it calls (kvstores, predictor), the proto conversions, the KV event
feeds (kvstore streams, vLLM ZMQ) and the durable state store; the core they
wrap lives one level up."""
