"""The disk tier below a node's host tier: block records in preallocated files (docs/disk.md)."""
