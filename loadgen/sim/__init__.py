"""Discrete-event simulator: the live cluster's engine model, scheduler core,
policies and predictor on a virtual clock, without gRPC and without sleeping."""
