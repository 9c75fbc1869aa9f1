"""Session-return foresight: at the end of each turn of a conversation, the
probability that its next turn arrives within a few horizons, and the
expected time to it (DESIGN.md, "Two kinds of foresight").

Pure domain cores (no grpc, no environment, no global state), one module per
concept:
- turns: trace requests -> turn records (conversation, index, arrival, end,
  tokens, next arrival), with an injectable service-time model;
- features: ReturnFeatures, the one online builder of a turn end's feature
  row (the offline dataset feeds it the same events the live system does);
- dataset: the offline rows, labels and censoring masks built through it;
- survival: horizon probabilities -> monotone CDF, conditional probabilities
  and expected (remaining) return time;
- model: one LightGBM binary classifier per horizon, censored labels;
- baselines: constant base rate and empirical rates by bucket;
- evaluation: AUC, Brier, ECE and calibration tables;
- tracker: ReturnTracker, the online core holding open conversations;
- recalibration: the online, causal level recalibration (one core, offline
  replay and tracker alike); tuning: its parameters chosen before the
  evaluated slice;
- serving: ReturnsCore, the tracker as the predictor service serves it
  (two report streams matched, validation, filters, a lock);
- store: a model on disk (manifest + LightGBM text) and past turns for
  warming a tracker;
- training: a model trained before a cut, optionally on a replay's clock;
- config: the `session_return` section of services/config/predictor.json.
"""
