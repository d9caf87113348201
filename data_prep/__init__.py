"""data_prep package."""
