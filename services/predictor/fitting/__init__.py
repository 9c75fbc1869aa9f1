"""Datasets, training, selection, tuning and background retraining of the predictor's models: produces the model directories serving loads."""
