"""Engines that serve the replayed requests: the emulated engine (live and
simulated), its live driver, and a real PyTorch decoder with its KV."""
