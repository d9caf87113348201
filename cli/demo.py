"""The end-to-end demo, `bert-demo [--output_dir DIR] [--corpus FILE]` (or `python demo.py`):
raw text -> pre-trained, fine-tuned, exported, served BERT. The log file is
<output_dir>/demo.log.

On a corpus every machine has (the Python standard library's docstrings, one module a
document; or `--corpus`, blank-line-separated documents) it runs, printing what each step made
and where:
  1. bertPrep: text_formatting, create_vocab, sharding, create_tfrecord_files (seq 64 and 128)
  2. run_pretraining phase 1 (seq 64) then phase 2 (seq 128, from phase 1's weights)
  3. run_classifier on a small task built from the same text: is a sentence about the
     internet, mail or markup (modules email, http, urllib, xml, ...) or not (SST-2 layout)
  4. SavedModel export and one inference from it
Each step calls the same package code as the command-line tools, with their flags'
defaults.
"""
import json
import os
import random
import re
import time

from cli.command import Command
from cli.flag_groups import INPUT, OUTPUT, TRAINING, binders


def _banner(number, title):
    print(f"\n== {number}. {title}", flush=True)
    return time.time()


def _done(start, what):
    print(f"   {what} [{time.time() - start:.1f} s]", flush=True)


def write_stdlib_corpus(path, max_documents=None, whole_sentences=True):
    """Standard-library docstrings as blank-line-separated documents. Returns the count.
    `whole_sentences`: only the sentences a sequence holds whole (`sentence_document`:
    the demo's data then loses no tokens to truncation); False: every docstring's prose,
    the corpus bench/convergence.py's recorded results were measured on."""
    from data_prep.bertprep.builtin_corpus import iter_documents, sentence_document
    from data_prep.bertprep.sentence_segmentation import get_splitter
    split = get_splitter("auto")
    count = 0
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as writer:
        for _, text in iter_documents():
            if max_documents is not None and count >= max_documents:
                break
            if whole_sentences:
                text = sentence_document(text, split)
                if len(split(text)) < 2:  # nothing left for a next sentence to follow
                    continue
            writer.write(text + "\n\n")
            count += 1
    os.replace(tmp, path)
    return count


# Modules whose docstrings talk about the internet, mail and markup: the demo's topic task.
INTERNET_MODULES = re.compile(r"/(email|http|urllib|xmlrpc|wsgiref|html|xml|smtplib|imaplib|"
                              r"poplib|ftplib|socket|ssl|mailbox|mimetypes|ipaddress|"
                              r"socketserver|webbrowser|nntplib|telnetlib|uu|quopri|base64)\b")


def write_topic_task(folder, examples_per_class=900, seed=0):
    """SST-2-layout train/dev TSVs: is a docstring sentence about the internet, mail or markup
    (label 1) or something else (0)? Modules, not sentences, are split between train and dev
    (every 5th module goes to dev), so dev measures generalisation to unseen modules."""
    from data_prep.bertprep.builtin_corpus import iter_documents
    rng = random.Random(seed)
    by_split = {"train": {0: [], 1: []}, "dev": {0: [], 1: []}}
    for index, (path, text) in enumerate(iter_documents()):
        label = int(bool(INTERNET_MODULES.search(path)))
        split = "dev" if index % 5 == 4 else "train"
        sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text)
                     if 6 <= len(s.split()) <= 40 and "\t" not in s]
        by_split[split][label].extend(sentences)
    sizes = {}
    os.makedirs(folder, exist_ok=True)
    for split, limit in (("train", examples_per_class), ("dev", examples_per_class // 4)):
        count = min(limit, *(len(v) for v in by_split[split].values()))
        rows = [f"{sentence}\t{label}" for label, sentences in by_split[split].items()
                for sentence in rng.sample(sentences, count)]
        rng.shuffle(rows)
        with open(os.path.join(folder, f"{split}.tsv"), "w", encoding="utf-8") as writer:
            writer.write("sentence\tlabel\n" + "\n".join(rows) + "\n")
        sizes[split] = len(rows)
    return sizes["train"], sizes["dev"]


# The pre-training recipe, chosen on this corpus so that the held-out masked-LM loss ends
# clearly below the unigram baseline (pretraining.baseline: what predicting the training
# records' token frequencies reaches) in well under a minute of 2 cores: at 300 steps and
# 5e-3 the model learned the frequencies and nothing more (6.31 against 6.33); 600 steps at
# 1e-2 end near 5.9. Held-out numbers over 50 batches (320 examples are too few to tell
# recipes apart: their loss varies by ~0.05 between evaluation sets).
PHASE1_LEARNING_RATE, PHASE2_LEARNING_RATE = 1e-2, 2e-3
EVAL_BATCH_SIZE, MAX_EVAL_STEPS = 32, 50


def prepare_demo_data(output_dir, corpus=None, n_processes=2):
    """Step 1 of the demo: `corpus` (default: the standard library's docstrings, written to
    `output_dir`) through bertPrep's actions into `output_dir`/data. Returns the vocabulary
    file and the record folders by sequence length ({64: ..., 128: ...})."""
    from data_prep.bertprep.prep_actions import run as prep
    from data_prep.bertprep.prep_layout import Layout, PrepOptions
    work = os.path.join(output_dir, "data")
    os.makedirs(work, exist_ok=True)
    if corpus is None:
        corpus = os.path.join(output_dir, "stdlib_docstrings.txt")
        count = write_stdlib_corpus(corpus)
        print(f"   corpus: {corpus}: {count} documents (Python standard library docstrings, "
              f"whole sentences, {os.path.getsize(corpus) / 1e6:.1f} MB)")
    base = dict(dataset="custom", working_dir=work, input=(corpus,), n_training_shards=2,
                n_test_shards=1, fraction_test_set=0.1, n_processes=n_processes, vocab_size=4000,
                dupe_factor=3, progress=False)
    layout = Layout(work)
    for action in ("text_formatting", "create_vocab", "sharding"):
        prep(PrepOptions(action=action, **base))
    vocab = layout.vocab_file("custom", True)
    print(f"   formatted: {layout.formatted_file('custom')}\n   vocab: {vocab}")
    records = {}
    for seq, predictions in ((64, 10), (128, 20)):
        options = PrepOptions(action="create_tfrecord_files", vocab_file=vocab,
                              max_seq_length=seq, max_predictions_per_seq=predictions, **base)
        prep(options)
        records[seq] = layout.tfrecord_dir("custom", options)
        print(f"   records (seq {seq}): {records[seq]}")
    return vocab, records


def demo_precision(choice="auto"):
    """(amp, what to say) for pre-training in `choice` (fp32|bf16), or auto: bf16 where the
    CPU multiplies bfloat16 natively (AVX512_BF16, AMX), fp32 elsewhere. Measured, the demo's
    pre-training in bf16 against fp32: 1.8-1.9x slower with oneDNN held to AVX2
    (ONEDNN_MAX_CPU_ISA=AVX2: no native bfloat16, as on an AVX2 CPU, where TensorFlow says
    "oneDNN BFloat16 support are only on platforms with AVX512"), 0.94-0.96x on a Zen 5 that
    multiplies it natively; there bf16 stays, as before, because the fine-tuning after it
    learned in all 4 bf16 runs (dev accuracy 0.71-0.74) and in 4 of 5 fp32 runs (one 0.52)
    (bench/README.md, "Precision by CPU")."""
    from modeling.core import cpu_has_native_bfloat16
    if choice == "auto":
        choice = "bf16" if cpu_has_native_bfloat16() else "fp32"
    if choice not in ("fp32", "bf16"):
        raise ValueError(f"--precision={choice}: auto, fp32 or bf16")
    return choice == "bf16", choice


def run_demo(output_dir, corpus=None, phase1_steps=600, phase2_steps=40, n_processes=2,
             precision="auto"):
    from data_prep.wordpiece.tokenization import FullTokenizer
    from finetuning.driver import run as finetune
    from finetuning.inference import load_saved_model, predict
    from finetuning.options import ClassifierOptions
    from finetuning.tasks import ClassifierTask
    from modeling import named_config
    from pretraining.baseline import unigram_baseline
    from pretraining.options import PretrainingOptions
    from pretraining.runner import run as pretrain
    from training.hooks import job_start_time

    job_start_time()  # the demo's own: each phase's start-up then counts from its beginning
    output_dir = os.path.abspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    total = time.time()

    start = _banner(1, "data preparation (bertPrep.py)")
    vocab, records = prepare_demo_data(output_dir, corpus, n_processes)
    _done(start, "data ready")

    config_file = os.path.join(output_dir, "bert_config.json")
    vocab_size = sum(1 for _ in open(vocab, encoding="utf-8"))
    named_config("tiny").replace(vocab_size=vocab_size).to_json_file(config_file)
    amp, precision_said = demo_precision(precision)
    phases = {}
    for phase, seq, predictions, steps, lr, init in (
            (1, 64, 10, phase1_steps, PHASE1_LEARNING_RATE, None),
            (2, 128, 20, phase2_steps, PHASE2_LEARNING_RATE, "phase_1")):
        start = _banner(1 + phase, f"pre-training phase {phase}: tiny BERT "
                                   f"(2 layers, hidden 64), seq {seq}, {steps} LAMB steps, "
                                   f"{precision_said}")
        out = os.path.join(output_dir, f"phase_{phase}")
        train_files = os.path.join(records[seq], "training")
        eval_files = os.path.join(records[seq], "test")
        values = PretrainingOptions.of(
            bert_config_file=config_file,
            input_files_dir=train_files, eval_files_dir=eval_files,
            output_dir=out, do_train=True, do_eval=True, max_seq_length=seq,
            max_predictions_per_seq=predictions, train_batch_size=32,
            eval_batch_size=EVAL_BATCH_SIZE, num_train_steps=steps,
            num_warmup_steps=max(1, steps // 10), learning_rate=lr,
            save_checkpoints_steps=max(1, steps // 2), display_loss_steps=max(1, steps // 5),
            max_eval_steps=MAX_EVAL_STEPS, amp=amp, amp_dtype="bfloat16", use_xla=False,
            init_checkpoint=os.path.join(output_dir, init) if init else None,
            dllog_path=os.path.join(out, "dllog.jsonl"), lamb_layer_adaptation="all")
        results = pretrain(values)
        # What a model that ignores the context reaches on the same held-out examples.
        results["baseline"] = unigram_baseline(
            train_files, eval_files, config_file, seq, predictions,
            max_eval_examples=MAX_EVAL_STEPS * EVAL_BATCH_SIZE, eval_batch_size=EVAL_BATCH_SIZE)
        phases[phase] = results
        evaluation, baseline = results["eval"], results["baseline"]
        _done(start, f"checkpoints in {out}; held-out masked-LM loss "
                     f"{evaluation['masked_lm_loss']:.3f}, accuracy "
                     f"{evaluation['masked_lm_accuracy']:.3f} (unigram baseline: loss "
                     f"{baseline['masked_lm_loss']:.3f}, accuracy "
                     f"{baseline['masked_lm_accuracy']:.3f})")

    start = _banner(4, "fine-tuning (run_classifier.py): is a sentence about the internet?")
    task_dir = os.path.join(output_dir, "topic_task")
    train_size, dev_size = write_topic_task(task_dir)
    print(f"   task: {task_dir} ({train_size} train / {dev_size} dev sentences, SST-2 layout; "
          f"dev modules unseen in training)")
    out = os.path.join(output_dir, "finetuned")
    export_dir = os.path.join(output_dir, "export")
    values = ClassifierOptions.of(
        task_name="sst-2", data_dir=task_dir, vocab_file=vocab,
        bert_config_file=config_file, init_checkpoint=os.path.join(output_dir, "phase_2"),
        output_dir=out, do_train=True, do_eval=True, max_seq_length=64, train_batch_size=32,
        learning_rate=5e-4, num_train_epochs=3.0, export_dir=export_dir,
        display_loss_steps=20, optimizer_type="adam", amp=False, use_xla=False)
    results = finetune(ClassifierTask("sst-2", task_dir, 64), values)
    dev = results["dev"]
    _done(start, f"dev accuracy {dev['eval_accuracy']:.3f} (chance 0.5); "
                 f"results in {out}/eval_results.txt")

    start = _banner(5, "export and serve")
    saved_model = results["saved_model"]
    print(f"   SavedModel: {saved_model}")
    task, runner, vocab_file, lower = load_saved_model(saved_model)
    queries = ["Send the message to the mail server and return the HTTP response headers.",
               "Return the sum of the numbers in the list, sorted in ascending order."]
    answers = predict(task, runner, FullTokenizer(vocab_file, lower),
                      [{"text": text} for text in queries])
    for text, answer in zip(queries, answers):
        print(f"   {json.dumps(text)} -> label {answer['label']} "
              f"(P(internet) = {answer['probabilities']['1']:.3f})")
    # The whole dev set through the SavedModel: what it serves is what was evaluated.
    with open(os.path.join(task_dir, "dev.tsv"), encoding="utf-8") as reader:
        dev_rows = [line.rstrip("\n").split("\t") for line in reader][1:]
    served = predict(task, runner, FullTokenizer(vocab_file, lower),
                     [{"text": text} for text, _ in dev_rows])
    served_accuracy = sum(str(answer["label"]) == label
                          for answer, (_, label) in zip(served, dev_rows)) / len(dev_rows)
    print(f"   served the {len(dev_rows)} dev sentences: accuracy {served_accuracy:.3f} "
          f"(the evaluation's: {dev['eval_accuracy']:.3f})")
    _done(start, "served from the SavedModel")
    print(f"\ndemo finished in {time.time() - total:.0f} s; everything is under {output_dir}")
    return {"phases": phases, "finetune": results, "answers": answers}


def define_flags(flag_values):
    inp, train, out = binders(flag_values, INPUT, TRAINING, OUTPUT)
    inp.DEFINE_string("corpus", None, "Your own text: documents separated by blank lines. "
                      "Default: the Python standard library's docstrings, built on the spot.")
    train.DEFINE_integer("phase1_steps", 600, "Pre-training steps at sequence length 64.")
    train.DEFINE_integer("phase2_steps", 40, "Pre-training steps at sequence length 128.")
    train.DEFINE_enum("precision", "auto", ["auto", "fp32", "bf16"],
                      "Pre-training's precision; auto: bf16 where the CPU multiplies bfloat16 "
                      "natively (AVX512_BF16, AMX), fp32 elsewhere.")
    out.DEFINE_string("output_dir", "demo_out", "Everything the demo makes goes here.")


def main(flags):
    run_demo(flags.output_dir, flags.corpus, flags.phase1_steps, flags.phase2_steps,
             precision=flags.precision)
    return 0


COMMAND = Command("demo", __doc__, define_flags, main,
                  log_folder=lambda flags: flags.output_dir)
