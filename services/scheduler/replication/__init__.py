"""Replication orders: the planner, budgets, the order state machine, its
lifecycle, the feed of issued orders, and the replicas they placed."""
