"""The end-to-end demo on a corpus that every machine has.

Steps so far: build a corpus from the standard library's docstrings (or `--corpus`), train a
WordPiece vocabulary on it, build a tiny BERT from the shipped config, save it as a
Google-format checkpoint, reload it, and encode a sentence, printing what each step produced
and where. Later stages (pre-training data, pre-training, fine-tuning, export) are added here
as they land.
"""
import os
import time

import numpy as np


def _step(title):
    print(f"\n== {title}", flush=True)
    return time.time()


def run_demo(output_dir, corpus=None, sentence="BERT reads text in both directions at once.",
             vocab_size=4000, compute_type="float32"):
    import tensorflow as tf

    from data_prep.builtin_corpus import write_corpus
    from data_prep.tokenization import FullTokenizer
    from data_prep.vocab import train_wordpiece_vocab
    from modeling import BertModel, named_config
    from modeling.checkpoints import init_from_checkpoint

    tf1 = tf.compat.v1
    os.makedirs(output_dir, exist_ok=True)

    start = _step("corpus")
    if corpus is None:
        corpus = os.path.join(output_dir, "stdlib_docstrings.txt")
        documents, size = write_corpus(corpus)
        print(f"built {corpus}: {documents} documents (one Python module each), "
              f"{size / 1e6:.1f} MB [{time.time() - start:.1f} s]")
    else:
        print(f"using {corpus} ({os.path.getsize(corpus) / 1e6:.1f} MB)")

    start = _step("vocabulary")
    vocab_file = os.path.join(output_dir, "vocab.txt")
    count = train_wordpiece_vocab([corpus], vocab_file, vocab_size=vocab_size)
    print(f"trained a {count}-token WordPiece vocab: {vocab_file} [{time.time() - start:.1f} s]")

    start = _step("tiny BERT")
    config = named_config("tiny").replace(vocab_size=count)
    config_file = os.path.join(output_dir, "bert_config.json")
    config.to_json_file(config_file)
    tokenizer = FullTokenizer(vocab_file, do_lower_case=True)
    tokens = ["[CLS]"] + tokenizer.tokenize(sentence) + ["[SEP]"]
    ids = np.array([tokenizer.convert_tokens_to_ids(tokens)], np.int32)
    checkpoint = os.path.join(output_dir, "tiny_bert", "bert_model.ckpt")
    with tf.Graph().as_default():
        tf1.set_random_seed(0)
        BertModel(config, False, tf.zeros([1, 8], tf.int32))
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            tf1.train.Saver().save(session, checkpoint, write_meta_graph=False)
    print(f"{config.num_hidden_layers} layers, hidden {config.hidden_size}: config {config_file}, "
          f"randomly initialised checkpoint {checkpoint} [{time.time() - start:.1f} s]")

    start = _step(f"encode one sentence ({compute_type})")
    with tf.Graph().as_default():
        model = BertModel(config, False, tf.constant(ids), compute_type=compute_type)
        init_from_checkpoint(checkpoint, log=False)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            pooled, sequence = session.run([model.get_pooled_output(),
                                            model.get_sequence_output()])
    print(f"sentence: {sentence}")
    print(f"tokens:   {' '.join(tokens)}")
    print(f"sequence output {sequence.shape}, pooled output {pooled.shape}, "
          f"norm {np.linalg.norm(pooled):.4f}")
    print("pooled[:8] = " + " ".join(f"{x:+.4f}" for x in pooled[0, :8]))
    print(f"[{time.time() - start:.1f} s]")
    return pooled
