"""The routing client a router embeds: Route with a deadline, failing open (docs/client.md)."""
