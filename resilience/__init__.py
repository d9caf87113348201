"""Keeping a run safe: one run per output folder (`run_lock`), a data order and global batch a
resume must keep (`data_order`), a checkpoint without accumulation state resumed into a run
that accumulates (`accumulation_state`), a full disk (`disk_space`), failures explained in one line (`failures`),
files written whole or not at all (`atomic_files`), a diverged loss (`divergence`), and bad
records found, skipped and named (`record_guard`, `record_scan`); the session runs that close an
accumulation window, where collectives that stop a run are fetched (`window_boundaries`)."""
