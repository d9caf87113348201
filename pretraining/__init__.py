"""BERT pre-training: records in (`input_pipeline`, `record_checks`, `record_kinds`, dynamic
masking), the Estimator model_fn, the run driver (`runner`) and its plan; its options are
`options`; the GPU preflight (`preflight`, `preflight_report`, `published_speed`)."""
