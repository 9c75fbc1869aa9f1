"""`speckv bench scheduler`: the scheduler's planning cost on a synthetic cluster (cli), its server and synthetic cluster."""
