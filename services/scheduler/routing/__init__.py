"""Routing: the router's cost of each candidate node, the load board that
finds the least-loaded nodes, and the link backlog."""
