"""SQuAD features (finetuning.squad_data) and predictions (finetuning.squad_postprocess) on the
real SQuAD v1.1 sample with the real all-MiniLM-L6-v2 (BERT uncased) vocab."""
import copy
import json
import os
import time

import numpy as np
import pytest

from data_prep.wordpiece.tokenization import FullTokenizer
from finetuning import squad_data, squad_eval, squad_postprocess

SAMPLE = "squad/sample-v1.1.json"
# (max_seq_length, doc_stride, max_query_length)
CONFIGS = [(128, 64, 32), (384, 128, 64)]


@pytest.fixture(scope="module")
def tokenizer(minilm_vocab):
    return FullTokenizer(minilm_vocab, do_lower_case=True)


@pytest.fixture(scope="module")
def sample(shared_data):
    path = os.path.join(shared_data, SAMPLE)
    with open(path, encoding="utf-8") as f:
        return path, json.load(f)


@pytest.fixture(scope="module")
def train_examples(sample):
    return squad_data.read_squad_examples(sample[0], is_training=True)


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: "seq%d-stride%d-query%d" % c)
def train_features(request, train_examples, tokenizer):
    max_seq_length, doc_stride, max_query_length = request.param
    started = time.perf_counter()
    features = squad_data.convert_examples_to_features(
        train_examples, tokenizer, max_seq_length, doc_stride, max_query_length, True)
    elapsed = time.perf_counter() - started
    print(f"\n{request.param}: {len(train_examples)} examples -> {len(features)} features "
          f"in {elapsed:.2f} s")
    return request.param, features


def _mid_word(context, start, text):
    """Whether the annotated answer starts or ends inside a run of letters/digits."""
    end = start + len(text) - 1
    return ((start > 0 and context[start - 1].isalnum() and context[start].isalnum())
            or (end + 1 < len(context) and context[end].isalnum() and context[end + 1].isalnum()))


def _recovered_text(example, feature, start, end, do_lower_case=True):
    pieces = feature.tokens[start:end + 1]
    first, last = feature.token_to_orig_map[start], feature.token_to_orig_map[end]
    orig_text = " ".join(example.doc_tokens[first:last + 1])
    return squad_postprocess.get_final_text(squad_postprocess.pieces_to_text(pieces), orig_text,
                                            do_lower_case)


# ---------------------------------------------------------------------------
# Reading.

def test_read_examples(sample, train_examples):
    _, dataset = sample
    questions = [(p["context"], qa) for a in dataset["data"] for p in a["paragraphs"]
                 for qa in p["qas"]]
    assert len(train_examples) == len(questions) == 1057  # nothing skipped in the sample
    for example, (context, qa) in zip(train_examples, questions):
        assert example.qas_id == qa["id"] and not example.is_impossible
        assert example.doc_tokens == context.split()  # the sample has no U+202F
        answer = qa["answers"][0]
        assert example.orig_answer_text == answer["text"].strip()
        # The word span contains the annotated answer.
        words = " ".join(example.doc_tokens[example.start_position:example.end_position + 1])
        assert " ".join(answer["text"].split()) in words
    # Questions of one paragraph share the word list (it is tokenized once).
    assert train_examples[0].doc_tokens is train_examples[1].doc_tokens
    eval_examples = squad_data.read_squad_examples(sample[0], is_training=False)
    assert [e.qas_id for e in eval_examples] == [e.qas_id for e in train_examples]
    assert eval_examples[0].start_position is None


def test_split_doc_words_offsets():
    words, offsets = squad_data.split_doc_words(" ab  c\u202fd\te ")
    assert words == ["ab", "c", "d", "e"]
    assert offsets == [-1, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3]


def test_unrecoverable_answers_are_skipped():
    dataset = {"data": [{"title": "t", "paragraphs": [{"context": "Alpha beta gamma.", "qas": [
        {"id": "ok", "question": "q?", "answers": [{"text": " beta", "answer_start": 5}]},
        {"id": "moved", "question": "q?", "answers": [{"text": "delta", "answer_start": 6}]},
        {"id": "outside", "question": "q?", "answers": [{"text": "gamma", "answer_start": 40}]},
        {"id": "none", "question": "q?", "answers": [], "is_impossible": True}]}]}]}
    examples, skipped = squad_data.parse_squad_examples(dataset, is_training=True)
    assert [e.qas_id for e in examples] == ["ok", "none"]
    assert (examples[0].start_position, examples[0].end_position) == (1, 1)
    assert (examples[1].start_position, examples[1].orig_answer_text) == (-1, "")
    assert [qid for qid, _ in skipped] == ["moved", "outside"]


# ---------------------------------------------------------------------------
# Features.

def test_answer_spans_recovered(train_examples, train_features, record_property):
    """tokens[start:end+1] mapped back to the original text gives the answer, for every
    question; the only failures are answers that begin or end inside a word of the context
    (e.g. "8" annotated inside "20–18"), which no word-level span can express."""
    config, features = train_features
    by_example = {}
    for feature in features:
        if feature.start_position > 0:
            example = train_examples[feature.example_index]
            text = _recovered_text(example, feature, feature.start_position, feature.end_position)
            ok = (squad_eval.normalize_answer(text)
                  == squad_eval.normalize_answer(example.orig_answer_text))
            by_example.setdefault(feature.example_index, []).append((ok, text))
    # Every answer lies inside at least one window.
    assert len(by_example) == len(train_examples)
    failures = {}
    for index, outcomes in by_example.items():
        assert len({ok for ok, _ in outcomes}) == 1  # all windows agree
        if not outcomes[0][0]:
            failures[train_examples[index].qas_id] = (train_examples[index].orig_answer_text,
                                                      outcomes[0][1])
    rate = 1 - len(failures) / len(train_examples)
    record_property("answer_recovery_rate", rate)
    print(f"\n{config}: answers recovered {len(train_examples) - len(failures)}/"
          f"{len(train_examples)} ({100 * rate:.2f}%); failures: {failures}")
    assert rate >= 0.98, failures
    for qid, (answer, got) in failures.items():
        # What comes back is the whole word(s) holding the answer.
        assert answer.lower() in got.lower() and len(got) > len(answer), (qid, answer, got)


def test_failures_are_mid_word_answers(sample, train_examples, tokenizer):
    """Cross-check on raw data: every answer whose characters do not cut a word is recovered."""
    _, dataset = sample
    features = squad_data.convert_examples_to_features(train_examples, tokenizer, 384, 128,
                                                       64, True)
    recovered = {}
    for feature in features:
        if feature.start_position > 0:
            example = train_examples[feature.example_index]
            text = _recovered_text(example, feature, feature.start_position, feature.end_position)
            recovered[example.qas_id] = (squad_eval.normalize_answer(text)
                                         == squad_eval.normalize_answer(example.orig_answer_text))
    mid_word = 0
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answer = qa["answers"][0]
                if _mid_word(paragraph["context"], answer["answer_start"], answer["text"]):
                    mid_word += 1
                else:
                    assert recovered[qa["id"]], qa
    assert 0 < sum(not ok for ok in recovered.values()) <= mid_word


def _reference_doc_pieces(example, tokenizer):
    """Google's way: each word through the full tokenizer, one by one."""
    pieces, piece_to_word = [], []
    for index, word in enumerate(example.doc_tokens):
        for piece in tokenizer.tokenize(word):
            pieces.append(piece)
            piece_to_word.append(index)
    return pieces, piece_to_word


def _reference_max_context(spans, span_index, position):
    best, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best is None or score > best:
            best, best_index = score, index
    return best_index == span_index


def test_feature_layout_windows_and_max_context(train_examples, train_features, tokenizer):
    (max_seq_length, doc_stride, max_query_length), features = train_features
    cls_id, sep_id = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    by_example = {}
    for number, feature in enumerate(features):
        assert feature.unique_id == 1000000000 + number
        by_example.setdefault(feature.example_index, []).append(feature)
    assert sorted(by_example) == list(range(len(train_examples)))
    checked_examples = 0
    for example_index, example_features in by_example.items():
        example = train_examples[example_index]
        query = tokenizer.tokenize(example.question_text)[:max_query_length]
        pieces, piece_to_word = _reference_doc_pieces(example, tokenizer)
        offset = len(query) + 2
        spans = []
        max_context_count = [0] * len(pieces)
        covered = [False] * len(pieces)
        for span_index, f in enumerate(example_features):
            assert f.doc_span_index == span_index
            n = len(f.tokens)
            assert f.tokens[0] == "[CLS]" and f.tokens[offset - 1] == "[SEP]"
            assert f.tokens[-1] == "[SEP]" and f.tokens[1:offset - 1] == query
            assert "[SEP]" not in f.tokens[offset:-1] and "[CLS]" not in f.tokens[1:]
            assert len(f.input_ids) == len(f.input_mask) == len(f.segment_ids) == max_seq_length
            assert f.input_ids[:n] == tokenizer.convert_tokens_to_ids(f.tokens)
            assert f.input_ids[0] == cls_id and f.input_ids[n - 1] == sep_id
            assert f.input_ids[n:] == [0] * (max_seq_length - n)
            assert f.input_mask == [1] * n + [0] * (max_seq_length - n)
            assert f.segment_ids == [0] * offset + [1] * (n - offset) + [0] * (max_seq_length - n)
            # Window k starts at k * doc_stride (the windows here are longer than the stride).
            start = span_index * doc_stride
            length = n - offset - 1
            assert 1 <= length <= max_seq_length - len(query) - 3
            assert f.tokens[offset:-1] == pieces[start:start + length]
            assert sorted(f.token_to_orig_map) == list(range(offset, n - 1))
            assert sorted(f.token_is_max_context) == list(range(offset, n - 1))
            for i in range(length):
                assert f.token_to_orig_map[offset + i] == piece_to_word[start + i]
                covered[start + i] = True
                max_context_count[start + i] += f.token_is_max_context[offset + i]
            spans.append((start, length))
        # The last window ends at the last piece; windows cover every piece.
        assert spans[-1][0] + spans[-1][1] == len(pieces)
        assert all(covered)
        assert max_context_count == [1] * len(pieces)
        if len(spans) > 1:  # the rule, by brute force (ties go to the first window)
            checked_examples += 1
            for span_index, ((start, length), f) in enumerate(zip(spans, example_features)):
                for i in range(length):
                    assert f.token_is_max_context[offset + i] == _reference_max_context(
                        spans, span_index, start + i)
    if max_seq_length == 128:
        assert checked_examples > 0  # the 128 configuration really has several windows


def test_training_positions(train_examples, train_features):
    _, features = train_features
    for feature in features:
        assert not feature.is_impossible
        if feature.start_position == 0:
            assert feature.end_position == 0
        else:
            assert feature.token_to_orig_map.get(feature.start_position) is not None
            assert feature.start_position <= feature.end_position < len(feature.tokens) - 1


def test_impossible_questions_point_at_cls(tokenizer):
    dataset = {"data": [{"title": "t", "paragraphs": [{"context": "Alpha beta gamma.", "qas": [
        {"id": "no", "question": "What?", "answers": [], "is_impossible": True}]}]}]}
    examples, _ = squad_data.parse_squad_examples(dataset, is_training=True)
    (feature,) = squad_data.convert_examples_to_features(examples, tokenizer, 32, 8, 8, True)
    assert (feature.start_position, feature.end_position, feature.is_impossible) == (0, 0, True)
    with pytest.raises(ValueError, match="no room"):
        squad_data.convert_examples_to_features(examples, tokenizer, 4, 8, 8, True)


def test_tfrecords_parse_with_feature_spec(train_examples, tokenizer, tmp_path):
    import tensorflow as tf
    features = squad_data.convert_examples_to_features(train_examples[:40], tokenizer, 128, 64,
                                                       32, True)
    for is_training in (True, False):
        path = str(tmp_path / f"squad-{is_training}.tf_record")
        assert squad_data.write_features(features, path, is_training) == len(features)
        assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
        spec = squad_data.feature_spec(128, is_training)
        records = list(tf.data.TFRecordDataset(path).map(
            lambda r: tf.io.parse_single_example(r, spec)).as_numpy_iterator())
        assert len(records) == len(features)
        for record, f in zip(records, features):
            assert record["unique_ids"] == f.unique_id
            assert record["input_ids"].tolist() == f.input_ids
            assert record["input_mask"].tolist() == f.input_mask
            assert record["segment_ids"].tolist() == f.segment_ids
            if is_training:
                assert record["start_positions"] == f.start_position
                assert record["end_positions"] == f.end_position
                assert record["is_impossible"] == 0
            else:
                assert "start_positions" not in record
    # Every record holds exactly the spec's keys.
    raw = next(iter(tf.data.TFRecordDataset(path)))
    assert set(tf.train.Example.FromString(raw.numpy()).features.feature) == set(spec)


# ---------------------------------------------------------------------------
# Predictions.

def _gold_logits(features, max_seq_length, null_for=()):
    """Logits with the maximum at the gold span (or at [CLS] for examples in ``null_for``)."""
    results = []
    for f in features:
        start = np.zeros(max_seq_length, np.float32)
        end = np.zeros(max_seq_length, np.float32)
        if f.example_index in null_for:
            # The null score is the lowest [CLS] score over the windows: 20 in the first.
            start[0] = end[0] = 10.0 + f.doc_span_index
        elif f.start_position > 0:
            start[f.start_position] = end[f.end_position] = 10.0
        results.append({"unique_id": f.unique_id, "start_logits": start, "end_logits": end})
    return results


def test_round_trip_v1(sample, train_examples, tokenizer, tmp_path):
    _, dataset = sample
    features = squad_data.convert_examples_to_features(train_examples, tokenizer, 128, 64, 32,
                                                       True)
    results = _gold_logits(features, 128)
    files = [str(tmp_path / n) for n in ("predictions.json", "nbest_predictions.json")]
    started = time.perf_counter()
    predictions, nbest, null_odds = squad_postprocess.write_predictions(
        train_examples, features,
        [squad_postprocess.RawResult(**r) if i % 2 else r for i, r in enumerate(results)],
        20, 30, True, *files)
    print(f"\nwrite_predictions: {len(features)} features in "
          f"{time.perf_counter() - started:.2f} s")
    assert null_odds == {}
    assert json.load(open(files[0])) == predictions
    assert json.load(open(files[1])) == json.loads(json.dumps(nbest))
    assert sorted(os.listdir(tmp_path)) == ["nbest_predictions.json", "predictions.json"]
    wrong = [e.qas_id for e in train_examples
             if squad_eval.normalize_answer(predictions[e.qas_id])
             != squad_eval.normalize_answer(e.orig_answer_text)]
    result = squad_eval.evaluate(dataset, predictions)
    expected = 100.0 * (len(train_examples) - len(wrong)) / len(train_examples)
    print(f"round trip: EM {result['exact_match']:.2f} F1 {result['f1']:.2f}, "
          f"{len(wrong)} unrecoverable: {wrong}")
    assert len(wrong) <= 0.02 * len(train_examples)
    annotated = {qa["id"]: (p["context"], qa["answers"][0]) for a in dataset["data"]
                 for p in a["paragraphs"] for qa in p["qas"]}
    for qid in wrong:  # only answers that cut a word are lost
        context, answer = annotated[qid]
        assert _mid_word(context, answer["answer_start"], answer["text"]), (qid, answer)
    assert result["exact_match"] >= expected and result["f1"] >= result["exact_match"]
    for entries in nbest.values():
        assert entries[0]["start_logit"] + entries[0]["end_logit"] == 20.0
        assert sum(e["probability"] for e in entries) == pytest.approx(1.0)
        scores = [e["start_logit"] + e["end_logit"] for e in entries]
        assert scores == sorted(scores, reverse=True)
        assert len({e["text"] for e in entries}) == len(entries) <= 20


def test_round_trip_v2(sample, tokenizer, tmp_path):
    _, dataset = sample
    v2 = copy.deepcopy(dataset)
    v2["version"] = "v2.0"
    impossible = set()
    for i, qa in enumerate(qa for a in v2["data"] for p in a["paragraphs"] for qa in p["qas"]):
        qa["is_impossible"] = i % 4 == 0
        if qa["is_impossible"]:
            qa["answers"] = []
            impossible.add(qa["id"])
    examples, skipped = squad_data.parse_squad_examples(v2, is_training=True)
    assert not skipped
    features = squad_data.convert_examples_to_features(examples, tokenizer, 128, 64, 32, True)
    null_for = {i for i, e in enumerate(examples) if e.is_impossible}
    assert all((f.start_position, f.end_position) == (0, 0)
               for f in features if f.example_index in null_for)
    files = [str(tmp_path / n) for n in ("p.json", "n.json", "null_odds.json")]
    predictions, _, null_odds = squad_postprocess.write_predictions(
        examples, features, _gold_logits(features, 128, null_for), 20, 30, True, *files,
        version_2_with_negative=True, null_score_diff_threshold=0.0)
    assert json.load(open(files[2])) == null_odds
    for e in examples:
        if e.qas_id in impossible:
            assert predictions[e.qas_id] == "" and null_odds[e.qas_id] == 20.0
        else:
            assert predictions[e.qas_id] != "" and null_odds[e.qas_id] == -20.0
    result = squad_eval.evaluate(v2, predictions)
    assert result["NoAns_exact"] == 100.0 and result["NoAns_total"] == len(impossible)
    assert result["HasAns_exact"] >= 97.0
    # A threshold above the difference keeps the non-null answers.
    predictions, _, _ = squad_postprocess.write_predictions(
        examples, features, _gold_logits(features, 128, null_for), 20, 30, True, None, None,
        version_2_with_negative=True, null_score_diff_threshold=25.0)
    assert all(predictions[qid] for qid in impossible)


def test_spans_need_max_context(train_examples, tokenizer):
    """A span whose start piece has more context in another window is not predicted from
    the window where it has less."""
    features = squad_data.convert_examples_to_features(train_examples, tokenizer, 128, 64, 32,
                                                       True)
    checked = 0
    for first, second in zip(features, features[1:]):
        if first.example_index != second.example_index or checked >= 5:
            continue
        example = train_examples[first.example_index]
        # The last doc piece of a window is never its max-context window when another follows.
        position = len(first.tokens) - 2
        assert not first.token_is_max_context[position]
        word = example.doc_tokens[first.token_to_orig_map[position]]
        results = _gold_logits([f for f in features if f.example_index == first.example_index],
                               128)
        for r in results:
            r["start_logits"][:] = r["end_logits"][:] = 0.0
            if r["unique_id"] == first.unique_id:
                r["start_logits"][position] = r["end_logits"][position] = 10.0
        one = [f for f in features if f.example_index == first.example_index]
        _, nbest, _ = squad_postprocess.write_predictions(train_examples, one, results, 20, 30,
                                                          True, None, None)
        top = nbest[example.qas_id][0]
        assert top["start_logit"] + top["end_logit"] < 20.0, (word, top)
        checked += 1
    assert checked == 5


def test_get_final_text():
    get = squad_postprocess.get_final_text
    assert get("steve smith", "Steve Smith's", True) == "Steve Smith"
    assert get("1895", "(1895-1943).", True) == "1895"
    assert get("smith ' s", "Smith's.", True) == "Smith's"
    assert get("hello", "Héllo!", True) == "Héllo"
    assert get("nowhere", "Steve Smith", True) == "Steve Smith"  # not found: all of it
    assert get("Steve", "Steve Smith", False) == "Steve"


# ---------------------------------------------------------------------------
# Bad input.

def test_bad_files_give_one_line_errors(tmp_path):
    not_json = tmp_path / "broken.json"
    not_json.write_text("this is not json")
    no_data = tmp_path / "nodata.json"
    no_data.write_text(json.dumps({"version": "1.1", "articles": []}))
    for path, message in ((not_json, "not valid JSON"), (no_data, "no top-level 'data' key"),
                          (tmp_path / "absent.json", "cannot read")):
        with pytest.raises(squad_eval.SquadFileError) as info:
            squad_data.read_squad_examples(str(path), is_training=True)
        text = str(info.value)
        assert text.startswith(str(path)) and message in text and "\n" not in text
