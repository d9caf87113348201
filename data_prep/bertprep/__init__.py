"""bertPrep.py's actions (NVIDIA's names): download, text_formatting, sharding,
create_tfrecord_files, and the working folder's layout they share (`prep_layout`)."""
