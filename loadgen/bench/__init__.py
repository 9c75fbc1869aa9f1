"""Benchmarks: `speckv bench NAME`. Each prints numbers, writes JSON with
--json, and measures its ceiling in the same run."""
