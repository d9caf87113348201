"""Pre-training instances (create_pretraining_data.py, Google's format): read and tokenize a
corpus (`corpus`), plan sentence pairs (`instance_plan`), mask them (`masked_instances`) or
leave them for dynamic masking (`unmasked_instances`), pack rows (`packing`) and write
TFRecords with their metadata (`tfrecord_writer`, `record_metadata`); `pretraining_data`
runs the steps."""
