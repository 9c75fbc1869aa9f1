"""Session-return foresight, serving side: at the end of each turn of a
conversation, the probability that its next turn arrives within a few
horizons, and the expected time to it (docs/session_returns.md).

Pure domain cores (no grpc, no environment, no global state), one module per
concept:
- features: ReturnFeatures, the one online builder of a turn end's feature
  row (the offline dataset, fitting/returns/dataset.py, feeds it the same
  events the live system does);
- survival: horizon probabilities -> monotone CDF, conditional probabilities
  and expected (remaining) return time;
- model: ReturnModel, one LightGBM binary classifier per horizon as served;
- tracker: ReturnTracker, the online core holding open conversations;
- recalibration: the online, causal level recalibration (one core, offline
  replay and tracker alike);
- serving: ReturnsCore, the tracker as the predictor service serves it
  (two report streams matched, validation, filters, a lock);
- store: a model on disk (manifest + LightGBM text), written and read in one
  place, and past turns for warming a tracker.
The fitting side (fitting/returns): turns, dataset, model_training,
training, tuning, baselines; the judging side (judging/returns): evaluation.
The `session_return` config section: services/predictor/fitting/returns/config.py.
"""
