"""Session returns, fitting side: turn records, the offline rows, model training, recalibration tuning and the fitted baselines."""
