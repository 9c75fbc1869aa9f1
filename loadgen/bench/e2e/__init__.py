"""`speckv bench e2e`: each policy replayed on a live local cluster (cli), its engines, events, model, warm start and run."""
