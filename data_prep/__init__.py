"""Text to records, in four sub-packages (imports point down this list):

* `bertprep`: bertPrep.py's actions: download, text formatting, sharding, the built-in
  corpus, and the layout of the working folder; its `create_tfrecord_files` calls
  `instances`.
* `instances`: create_pretraining_data.py: a corpus read and tokenized, instances planned,
  masked (or left for dynamic masking), packed and written as TFRecords with their metadata.
* `wordpiece`: the Google-exact WordPiece tokenizer (and SentencePiece), vocabulary training.
* `processes`: worker processes, their lifetimes, temporary files, test pause points.

`errors` (DataPrepError, DownloadError) is below all four.
"""
