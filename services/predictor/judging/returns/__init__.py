"""Session returns, judging side: AUC, Brier, ECE and calibration tables."""
