"""`speckv bench predictor`: forecast quality and latency per workload (cli) and the crafted model directories (crafted)."""
