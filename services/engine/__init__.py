"""The engines' side of speckv: connectors through which a real engine's KV enters and leaves the node's kvstore."""
