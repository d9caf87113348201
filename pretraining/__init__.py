"""BERT pre-training: records in, Estimator model_fn, run driver."""
