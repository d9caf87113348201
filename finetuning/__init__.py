"""Fine-tuning, one driver for every task (`driver`): GLUE classification and regression and
SQuAD (`tasks`, their data, heads and metrics), SavedModel and Triton export (`export`) and
serving from either (`inference`). Its options are `options`."""
