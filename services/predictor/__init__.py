"""The predictor: per prefix family arrival series and count forecasts.

Core modules (no grpc): series (the NumPy ring of counts), rates (EWMA and
last-step rate estimators), poisson (vectorised quantiles and tails), models
(the CountModel interface, BURST_DEFINITION and the rate baselines), manifest
(model directories), arrivals (observations and rejection reasons), core
(PredictorCore). gRPC face: config, servicer, server.
"""
