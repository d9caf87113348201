"""Machinery shared by pre-training and fine-tuning: Horovod, RunConfig, hooks, FLOPs."""
