"""`speckv bench transfer`: replication transfer rates against their ceilings (cli), kvstore processes, tiers and TLS."""
