"""`speckv bench chaos`: faults, limits and identity checks against a live cluster (cli), its cluster, report and cases."""
