"""The predictor service: per prefix family arrival counts and their
forecasts (Forecast, top-k), and session-return foresight (ForecastReturns).

Three sub-packages by role, imports one way (serving <- judging <- fitting):
- serving: what a running predictor needs to answer (the core, live counts
  and features, the served models and their loading, session-return
  serving); it imports neither fitting nor judging
  (tests/unit/services/predictor/test_walls.py);
- judging: the metrics models are scored by and the benches' own baselines;
- fitting: datasets, training, selection, tuning and the server's
  background retraining; it writes the model directories serving loads.
The gRPC face stays here: config, servicer, server (which wires serving
and fitting together: it reads the training sections of the config through
fitting and runs the background retrainer).
Docs: docs/predictor.md, docs/session_returns.md, docs/layout.md.
"""
