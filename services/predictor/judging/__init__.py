"""How the predictor's models are scored (metrics) and the benches' own reference forecasters."""
