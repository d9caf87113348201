"""Tasks for the one fine-tuning driver: what differs between GLUE classification and SQuAD.

A task provides
  data:    write_train_records(tokenizer, path) -> number of examples,
           load_split(split, tokenizer) -> (examples, features), write_records(features, path),
           feature_spec(is_training);
  model:   build_outputs(model, features, is_training), loss(outputs, features),
           predictions(outputs, features), serving_outputs(outputs, features),
           serving_output_spec(max_seq_length), extra_serving_inputs, eval_metric_ops;
  scoring: evaluate(split, examples, features, results, output_dir, global_step) -> metrics
           (writes the task's result files; eval_results.txt with Google's names,
           training/eval_results.py); no_learning(features, results) -> why the dev
           predictions show the model learned nothing, or None (the driver warns).
Everything else (encoder, precision, optimizer, Horovod, Estimator, export) is the driver's.
"""
import os

import numpy as np
import tensorflow as tf

from finetuning import (glue_data, glue_metrics, squad_data, squad_eval, squad_postprocess,
                        squad_version)
from finetuning.heads import (classification_head, classification_loss, squad_head,
                              squad_loss)
from modeling import BertModel

tf1 = tf.compat.v1


class TaskDataError(ValueError):
    """Task data missing or malformed; the message names the file."""


class ClassifierTask:
    """A GLUE task (or any task with a GLUE-style processor): sentence (pair) -> label/score."""

    extra_serving_inputs = ()

    def __init__(self, task_name, data_dir, max_seq_length):
        try:
            self.processor = glue_data.get_processor(task_name)
        except ValueError as err:
            raise TaskDataError(f"--task_name: {err}") from None
        self.name = glue_data.canonical_task_name(task_name)
        self.data_dir = data_dir
        self.max_seq_length = max_seq_length
        self.labels = self.processor.get_labels()
        self.is_regression = self.processor.is_regression
        self.num_labels = self.processor.num_labels

    @property
    def model_kind(self):
        """What messages call a model of this task."""
        return f"{self.name} classifier"

    @classmethod
    def from_options(cls, options):
        if not options.task_name:
            raise TaskDataError("--task_name is required")
        return cls(options.task_name, options.data_dir, options.max_seq_length)

    def validate_options(self, options):
        """Also reads the dev and test files the run will score (--do_eval, --do_predict),
        before training: a missing, malformed or empty one (a header alone) used to fail
        only after training, an empty one in an IndexError."""
        if (options.do_train or options.do_eval or options.do_predict) and not options.data_dir:
            raise TaskDataError("--data_dir is required to train, evaluate or predict")
        for split, wanted in (("dev", options.do_eval), ("predict", options.do_predict)):
            if wanted:
                self._split_examples(split)

    def metadata(self):
        """What a client of the exported model needs besides the vocabulary."""
        return {"task": self.name, "labels": list(self.labels),
                "is_regression": self.is_regression}

    # ------------------------------------------------------------------ data
    def feature_spec(self, is_training):
        return glue_data.feature_spec(self.max_seq_length, self.is_regression)

    def make_features(self, examples, tokenizer):
        return glue_data.convert_examples_to_features(examples, self.labels, self.max_seq_length,
                                                      tokenizer, self.is_regression)

    def write_train_records(self, tokenizer, path):
        examples = _read(self.processor.get_train_examples, self.data_dir)
        if not examples:
            raise TaskDataError(f"{os.path.join(self.data_dir, 'train.tsv')}: no training "
                                "examples (a header alone?)")
        self.write_records(self.make_features(examples, tokenizer), path)
        return len(examples)

    def _split_examples(self, split):
        """The examples of `split` ("dev" or "predict": the test file); TaskDataError naming
        the file when it has none (scores over no example are not defined)."""
        if split == "dev":
            reader, name = self.processor.get_dev_examples, self.processor.dev_file
        else:
            reader, name = self.processor.get_test_examples, self.processor.test_file
        examples = _read(reader, self.data_dir)
        if not examples:
            what = "dev examples to evaluate" if split == "dev" else "test examples to predict"
            raise TaskDataError(f"{os.path.join(self.data_dir, name)}: no {what} (a header "
                                "alone?): fill it, or drop "
                                f"{'--do_eval' if split == 'dev' else '--do_predict'}")
        return examples

    def load_split(self, split, tokenizer):
        examples = self._split_examples(split)
        return examples, self.make_features(examples, tokenizer)

    def write_records(self, features, path):
        glue_data.write_features_to_tfrecord(features, path, self.is_regression)

    # ------------------------------------------------------------------ model
    def output_positions(self, features):
        """The classifier reads only the pooled [CLS] output (`BertModel.output_positions`)."""
        return BertModel.POOLED_ONLY

    def build_outputs(self, model, features, is_training):
        logits = classification_head(model.get_pooled_output(), self.num_labels, is_training,
                                     model.config.initializer_range)
        return {"logits": logits}

    def loss(self, outputs, features):
        return classification_loss(outputs["logits"], features["label_ids"], self.is_regression)

    def predictions(self, outputs, features):
        return self.serving_outputs(outputs, features)

    def serving_outputs(self, outputs, features):
        if self.is_regression:
            return {"predictions": tf.squeeze(outputs["logits"], -1)}
        return {"probabilities": tf.nn.softmax(outputs["logits"], axis=-1)}

    def serving_output_spec(self, max_seq_length):
        if self.is_regression:
            return {"predictions": (tf.float32, [])}
        return {"probabilities": (tf.float32, [self.num_labels])}

    def eval_metric_ops(self, outputs, features):
        weights = tf.cast(features["is_real_example"], tf.float32)
        if self.is_regression:
            return {"eval_mse": tf1.metrics.mean_squared_error(
                features["label_ids"], tf.squeeze(outputs["logits"], -1), weights=weights)}
        predictions = tf.argmax(outputs["logits"], axis=-1, output_type=tf.int32)
        return {"eval_accuracy": tf1.metrics.accuracy(features["label_ids"], predictions,
                                                      weights=weights)}

    # ------------------------------------------------------------------ scoring
    def _values(self, results):
        key = "predictions" if self.is_regression else "probabilities"
        return np.array([r[key] for r in results], dtype=np.float64)

    def no_learning(self, features, results):
        """What shows that the dev predictions learned nothing (the majority class, or
        STS-B's mean: `glue_metrics.no_learning`), or None."""
        return glue_metrics.no_learning(self.name, self._values(results),
                                        np.array([f.label_id for f in features]),
                                        None if self.is_regression else self.labels)

    def evaluate(self, split, examples, features, results, output_dir, global_step=0):
        values = self._values(results)
        if split == "dev":
            labels = np.array([f.label_id for f in features])
            metrics = glue_metrics.eval_result_names(
                glue_metrics.task_metrics(self.name, values, labels))
            if self.is_regression:
                metrics["eval_loss"] = float(np.mean((values - labels) ** 2))
            else:
                picked = values[np.arange(len(labels)), labels.astype(int)]
                metrics["eval_loss"] = float(-np.mean(np.log(np.maximum(picked, 1e-12))))
            # Google's file also has the Estimator's `loss` (the mean loss over the dev
            # batches: the same mean here, as no padding examples are scored).
            metrics.update(loss=metrics["eval_loss"], global_step=int(global_step),
                           eval_examples=len(labels))
            glue_metrics.write_eval_results(os.path.join(output_dir, "eval_results.txt"),
                                            metrics)
            return metrics
        glue_metrics.write_test_results(os.path.join(output_dir, "test_results.tsv"), values,
                                        self.labels, self.name)
        submission = os.path.join(output_dir, glue_metrics.submission_file_name(self.name))
        glue_metrics.write_glue_submission(submission, values, self.labels, self.name)
        return {"test_examples": len(values), "submission": submission}


class SquadTask:
    """SQuAD v1.1 / v2.0: question + context -> answer span (or no answer)."""

    name = "squad"
    model_kind = "SQuAD"  # what messages call a model of this task
    extra_serving_inputs = ("unique_ids",)

    def __init__(self, train_file=None, predict_file=None, max_seq_length=384, doc_stride=128,
                 max_query_length=64, n_best_size=20, max_answer_length=30,
                 version_2_with_negative=False, null_score_diff_threshold=0.0,
                 do_lower_case=True, verbose_logging=False, seed=12345, eval_script=None,
                 max_predict_examples=None):
        """`eval_script`: a script run as NVIDIA's run_squad.py runs its --eval_script
        (`python SCRIPT predict_file predictions.json`, printing JSON), whose numbers are
        reported beside the built-in metric's; `max_predict_examples`: predict only the
        first questions (NVIDIA's --num_eval_iterations x --predict_batch_size)."""
        self.train_file, self.predict_file = train_file, predict_file
        self.max_seq_length, self.doc_stride = max_seq_length, doc_stride
        self.max_query_length, self.n_best_size = max_query_length, n_best_size
        self.max_answer_length = max_answer_length
        self.version_2_with_negative = version_2_with_negative
        self.null_score_diff_threshold = null_score_diff_threshold
        self.do_lower_case, self.verbose_logging, self.seed = do_lower_case, verbose_logging, seed
        self.eval_script, self.max_predict_examples = eval_script, max_predict_examples

    @classmethod
    def from_options(cls, options):
        """From `finetuning.options.SquadOptions`."""
        iterations = options.num_eval_iterations
        return cls(options.train_file, options.predict_file, options.max_seq_length,
                   options.doc_stride, options.max_query_length, options.n_best_size,
                   options.max_answer_length, options.version_2_with_negative,
                   options.null_score_diff_threshold, options.do_lower_case,
                   options.verbose_logging, options.seed, options.eval_script,
                   iterations * options.predict_batch_size if iterations else None)

    def validate_options(self, options):
        if options.do_train and not options.train_file:
            raise TaskDataError("--do_train needs --train_file")
        if options.do_predict and not options.predict_file:
            raise TaskDataError("--do_predict needs --predict_file")
        if self.eval_script and not os.path.isfile(self.eval_script):
            raise TaskDataError(f"{self.eval_script}: --eval_script: no such file")
        if options.max_seq_length <= options.max_query_length + 3:
            raise TaskDataError(f"--max_seq_length={options.max_seq_length} leaves no room for "
                                f"the context after --max_query_length={options.max_query_length}")
        if options.do_predict:  # before training: not a failure hours later, after it
            _read(self._check_version, self.predict_file, False)

    def _check_version(self, path, is_training):
        """`squad_version.check_version` of the file at `path` against this run's version."""
        squad_version.check_version(squad_eval.load_dataset(path),
                                    self.version_2_with_negative, is_training, path)

    def metadata(self):
        return {"task": self.name, "doc_stride": self.doc_stride,
                "max_query_length": self.max_query_length, "n_best_size": self.n_best_size,
                "max_answer_length": self.max_answer_length,
                "version_2_with_negative": self.version_2_with_negative,
                "null_score_diff_threshold": self.null_score_diff_threshold}

    # ------------------------------------------------------------------ data
    def feature_spec(self, is_training):
        return squad_data.feature_spec(self.max_seq_length, is_training)

    def make_features(self, examples, tokenizer, is_training):
        return squad_data.convert_examples_to_features(
            examples, tokenizer, self.max_seq_length, self.doc_stride, self.max_query_length,
            is_training)

    def write_train_records(self, tokenizer, path):
        examples = _read(squad_data.read_squad_examples, self.train_file, True,
                         self.version_2_with_negative)
        if not examples:
            raise TaskDataError(f"{self.train_file}: no training examples (every question "
                                "skipped: an empty file, or answers whose answer_start does "
                                "not point at their text)")
        # Articles come in order; shuffle the questions once (seeded), as Google does, so the
        # pipeline's small shuffle window does not see one article at a time.
        order = np.random.default_rng(self.seed).permutation(len(examples))
        features = self.make_features([examples[i] for i in order], tokenizer, True)
        squad_data.write_features(features, path, True)
        return len(examples)

    def load_split(self, split, tokenizer):
        examples = _read(squad_data.read_squad_examples, self.predict_file, False)
        examples = examples[:self.max_predict_examples]
        return examples, self.make_features(examples, tokenizer, False)

    def write_records(self, features, path):
        squad_data.write_features(features, path, False)

    # ------------------------------------------------------------------ model
    def output_positions(self, features):
        """SQuAD reads every position's start/end logits."""
        return None

    def build_outputs(self, model, features, is_training):
        start_logits, end_logits = squad_head(model.get_sequence_output(),
                                              model.config.initializer_range)
        return {"start_logits": start_logits, "end_logits": end_logits}

    def loss(self, outputs, features):
        return squad_loss(outputs["start_logits"], outputs["end_logits"],
                          features["start_positions"], features["end_positions"])

    def predictions(self, outputs, features):
        return self.serving_outputs(outputs, features)

    def serving_outputs(self, outputs, features):
        return {"unique_ids": tf.identity(features["unique_ids"]),
                "start_logits": outputs["start_logits"], "end_logits": outputs["end_logits"]}

    def serving_output_spec(self, max_seq_length):
        return {"unique_ids": (tf.int32, []), "start_logits": (tf.float32, [max_seq_length]),
                "end_logits": (tf.float32, [max_seq_length])}

    def eval_metric_ops(self, outputs, features):
        return {}

    def no_learning(self, features, results):
        """No constant-answer check for spans (the GLUE tasks have one)."""
        return None

    # ------------------------------------------------------------------ scoring
    def evaluate(self, split, examples, features, results, output_dir, global_step=0):
        """Writes predictions.json, nbest_predictions.json (and null_odds.json for v2.0);
        scores them with the official metric (exact_match and f1, NVIDIA's names too) when
        the predict file has answers."""
        null_odds_file = (os.path.join(output_dir, "null_odds.json")
                          if self.version_2_with_negative else None)
        results = [squad_postprocess.RawResult(int(r["unique_ids"]), r["start_logits"],
                                               r["end_logits"]) for r in results]
        predictions, _, null_odds = squad_postprocess.write_predictions(
            examples, features, results, self.n_best_size, self.max_answer_length,
            self.do_lower_case, os.path.join(output_dir, "predictions.json"),
            os.path.join(output_dir, "nbest_predictions.json"), null_odds_file,
            self.version_2_with_negative, self.null_score_diff_threshold, self.verbose_logging)
        metrics = {"questions": len(predictions)}
        dataset = squad_eval.load_dataset(self.predict_file)
        has_answers = any(qa.get("answers") for qa in squad_eval.iter_questions(
            squad_eval.dataset_articles(dataset, self.predict_file), self.predict_file))
        if has_answers:
            metrics.update(_read(
                squad_eval.evaluate, dataset, predictions,
                null_odds if self.version_2_with_negative else None, 1.0,
                self.version_2_with_negative, self.predict_file))
            metrics["global_step"] = int(global_step)
            glue_metrics.write_eval_results(os.path.join(output_dir, "eval_results.txt"),
                                            metrics)
        if self.eval_script:
            metrics.update(squad_eval.run_eval_script(
                self.eval_script, self.predict_file, os.path.join(output_dir, "predictions.json")))
        return metrics


def _read(reader, *args):
    """Runs a task data reader, turning its file errors into TaskDataError."""
    try:
        return reader(*args)
    except (glue_data.GlueDataError, squad_eval.SquadFileError) as err:
        raise TaskDataError(str(err)) from None
