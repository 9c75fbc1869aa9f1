"""Replication policies: what to copy where, each tick. See base.py."""
