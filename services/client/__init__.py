"""The routing client an inference router embeds: Route with a deadline, reports off the request path, and a fallback choice of its own when the scheduler cannot answer (docs/client.md)."""
