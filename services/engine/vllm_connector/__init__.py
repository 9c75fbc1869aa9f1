"""SpeckvConnector: vLLM's KV connector (KVConnectorBase_V1) onto the node's kvstore over gRPC."""
