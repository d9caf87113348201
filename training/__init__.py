"""The training step shared by pre-training and fine-tuning, and the run around it: settings
and the step itself (`settings`, `train_step`), the Estimator's RunConfig, hooks (progress,
throughput, preemption), FLOPs, record reading, exact resume (`resume`, `input_state`), and
what every job's options share (`options`, `option_ranges`)."""
