"""GLUE processors on every task's real file layout, features, padding and TFRecords."""
import os

import numpy as np
import pytest

from finetuning import glue_data
from finetuning.glue_data import GlueDataError, InputExample, PaddingInputExample

T = "\t"


def _write(folder, name, lines, bom=False):
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8-sig" if bom else "utf-8", newline="") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


def _row(*fields):
    return T.join(fields)


# ---------------------------------------------------------------------------
# Real layouts, a few realistic rows each (quotes are literal in GLUE)

def test_cola_layout(tmp_path):
    d = str(tmp_path)
    _write(d, "train.tsv", [
        _row("gj04", "1", "",
             "Our friends won't buy this analysis, let alone the next one we propose."),
        _row("gj04", "0", "*", "They drank the pub."),
        _row("cj99", "1", "", '"Who did you say that Mary saw?" John asked.'),
    ])
    _write(d, "dev.tsv", [_row("gj04", "1", "", "The sailors rode the breeze clear of the rocks.")])
    _write(d, "test.tsv", [_row("index", "sentence"), _row("0", "Bill whistled past the house."),
                           _row("1", 'The car "honked" its way down the road.')])
    p = glue_data.get_processor("CoLA")
    train = p.get_train_examples(d)
    assert train == [
        InputExample("train-0", "Our friends won't buy this analysis, let alone the next one "
                     "we propose.", None, "1"),
        InputExample("train-1", "They drank the pub.", None, "0"),
        InputExample("train-2", '"Who did you say that Mary saw?" John asked.', None, "1")]
    assert p.get_dev_examples(d)[0].text_a == "The sailors rode the breeze clear of the rocks."
    test = p.get_test_examples(d)
    assert [(e.guid, e.text_a, e.label) for e in test] == [
        ("test-0", "Bill whistled past the house.", "0"),
        ("test-1", 'The car "honked" its way down the road.', "0")]
    assert p.get_labels() == ["0", "1"] and not p.is_regression


def test_sst2_layout(tmp_path):
    d = str(tmp_path)
    _write(d, "train.tsv", [
        _row("sentence", "label"),
        _row("hide new secretions from the parental units ", "0"),
        _row('" the road to perdition " is a good movie ', "1"),
    ])
    _write(d, "test.tsv", [_row("index", "sentence"),
                           _row("0", "uneasy mishmash of styles and genres ."),
                           _row("1", '" a poor -- if durable -- imitation . "')])
    for name in ("sst-2", "SST2", "sst_2"):
        p = glue_data.get_processor(name)
        assert isinstance(p, glue_data.Sst2Processor)
    train = p.get_train_examples(d)
    assert train == [
        InputExample("train-1", "hide new secretions from the parental units ", None, "0"),
        InputExample("train-2", '" the road to perdition " is a good movie ', None, "1")]
    test = p.get_test_examples(d)
    assert [(e.guid, e.text_a, e.text_b, e.label) for e in test] == [
        ("test-0", "uneasy mishmash of styles and genres .", None, "0"),
        ("test-1", '" a poor -- if durable -- imitation . "', None, "0")]


def test_mrpc_layout_with_bom(tmp_path):
    d = str(tmp_path)
    header = _row("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")
    s1 = 'Amrozi accused his brother , whom he called " the witness " , of deliberately ' \
         'distorting his evidence .'
    s2 = 'Referring to him as only " the witness " , Amrozi accused his brother of ' \
         'deliberately distorting his evidence .'
    _write(d, "train.tsv", [header, _row("1", "702876", "702977", s1, s2),
                            _row("0", "2108705", "2108831", "Yucaipa owned Dominick 's .",
                                 "Yucaipa bought Dominick 's in 1995 .")], bom=True)
    _write(d, "dev.tsv", [header, _row("1", "1355540", "1355592", "He said .", "He says .")])
    # GLUE's own test.tsv starts with "index"; the MSR original has "Quality".
    _write(d, "test.tsv", [_row("index", "#1 ID", "#2 ID", "#1 String", "#2 String"),
                           _row("0", "1089874", "1089925", "PCCW 's chief .", "Current chief .")])
    p = glue_data.get_processor("mrpc")
    assert p.get_train_examples(d) == [
        InputExample("train-1", s1, s2, "1"),
        InputExample("train-2", "Yucaipa owned Dominick 's .",
                     "Yucaipa bought Dominick 's in 1995 .", "0")]
    assert p.get_dev_examples(d) == [InputExample("dev-1", "He said .", "He says .", "1")]
    assert p.get_test_examples(d) == [
        InputExample("test-1", "PCCW 's chief .", "Current chief .", "0")]
    _write(d, "test.tsv", [header, _row("0", "1089874", "1089925", "A .", "B .")])
    assert p.get_test_examples(d) == [InputExample("test-1", "A .", "B .", "0")]


def test_stsb_layout_regression(tmp_path):
    d = str(tmp_path)
    cols = ["index", "genre", "filename", "year", "old_index", "source1", "source2",
            "sentence1", "sentence2"]
    _write(d, "dev.tsv", [
        _row(*cols, "score"),
        _row("0", "main-captions", "MSRvid", "2012test", "0000", "none", "none",
             "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", "5.000"),
        _row("1", "main-news", "headlines", "2013", "0042", "none", "none",
             '"Obama" says no', "Obama says no deal", "3.800"),
    ])
    _write(d, "test.tsv", [
        _row(*cols),
        _row("0", "main-captions", "MSRvid", "2012test", "0024", "none", "none",
             "A girl is styling her hair.", "A girl is brushing her hair.")])
    p = glue_data.get_processor("STS-B")
    assert p.is_regression and p.get_labels() == [] and p.num_labels == 1
    assert glue_data.get_processor("stsb").is_regression
    dev = p.get_dev_examples(d)
    assert dev == [
        InputExample("dev-0", "A man with a hard hat is dancing.",
                     "A man wearing a hard hat is dancing.", 5.0),
        InputExample("dev-1", '"Obama" says no', "Obama says no deal", 3.8)]
    assert isinstance(dev[1].label, float)
    test = p.get_test_examples(d)
    assert test == [InputExample("test-0", "A girl is styling her hair.",
                                 "A girl is brushing her hair.", 0.0)]


def test_qqp_layout_skips_malformed_lines(tmp_path, caplog):
    d = str(tmp_path)
    _write(d, "train.tsv", [
        _row("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
        _row("133273", "213221", "213222", "How is the life of a math student?",
             "Which level of prepration is enough for the exam jlpt5?", "0"),
        # A question with a line break in it: two malformed lines.
        _row("363362", "493340", "493341", "What is the best way to learn"),
        _row('""Python""?', "How do I learn Python?", "1"),
        _row("402555", "536040", "536041", 'How do I read "War and Peace"?',
             '"War and Peace": how to read it?', "1"),
    ])
    _write(d, "test.tsv", [_row("id", "question1", "question2"),
                           _row("0", "Why do rockets look white?",
                                "Why are rockets and boosters painted white?")])
    p = glue_data.get_processor("QQP")
    with caplog.at_level("WARNING"):
        train = p.get_train_examples(d)
    assert train == [
        InputExample("train-133273", "How is the life of a math student?",
                     "Which level of prepration is enough for the exam jlpt5?", "0"),
        InputExample("train-402555", 'How do I read "War and Peace"?',
                     '"War and Peace": how to read it?', "1")]
    assert "skipped 2 malformed" in caplog.text
    assert p.get_test_examples(d) == [
        InputExample("test-0", "Why do rockets look white?",
                     "Why are rockets and boosters painted white?", "0")]


MNLI_COLS = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
             "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
             "sentence2"]


def _mnli_row(index, s1, s2, *labels):
    return _row(index, "31193", "31193n", "government", "( ( a b ) c )", "( d e )",
                "(ROOT (S (NP a)))", "(ROOT (S d))", s1, s2, *labels)


def test_mnli_layouts(tmp_path):
    d = str(tmp_path)
    _write(d, "train.tsv", [
        _row(*MNLI_COLS, "label1", "gold_label"),
        _mnli_row("0", "Conceptually cream skimming has two basic dimensions.",
                  "Product and geography are what make cream skimming work. ", "neutral",
                  "neutral"),
        _mnli_row("1", 'He said "yes".', "He agreed.", "entailment", "entailment")])
    dev_header = _row(*MNLI_COLS, "label1", "label2", "label3", "label4", "label5", "gold_label")
    _write(d, "dev_matched.tsv", [
        dev_header,
        _mnli_row("0", "The new rights are nice enough", "Everyone really likes the newest "
                  "benefits ", "neutral", "entailment", "neutral", "neutral", "neutral",
                  "neutral")])
    _write(d, "dev_mismatched.tsv", [
        dev_header,
        _mnli_row("7", "Your gift is appreciated.", "Hundreds of students will benefit.",
                  "neutral", "neutral", "contradiction", "neutral", "neutral", "contradiction")])
    _write(d, "test_matched.tsv", [_row(*MNLI_COLS), _mnli_row("0", "A", "B")])
    _write(d, "test_mismatched.tsv", [_row(*MNLI_COLS), _mnli_row("3", "C", "D")])
    p = glue_data.get_processor("MNLI")
    assert p.get_labels() == ["contradiction", "entailment", "neutral"]
    assert p.get_train_examples(d) == [
        InputExample("train-0", "Conceptually cream skimming has two basic dimensions.",
                     "Product and geography are what make cream skimming work. ", "neutral"),
        InputExample("train-1", 'He said "yes".', "He agreed.", "entailment")]
    dev = p.get_dev_examples(d)
    assert dev == [InputExample("dev-0", "The new rights are nice enough",
                                "Everyone really likes the newest benefits ", "neutral")]
    mm = p.get_dev_mismatched_examples(d)
    assert [(e.text_a, e.label) for e in mm] == [("Your gift is appreciated.", "contradiction")]
    assert p.get_test_examples(d) == [InputExample("test-0", "A", "B", "contradiction")]
    assert [e.text_a for e in p.get_test_mismatched_examples(d)] == ["C"]
    pmm = glue_data.get_processor("mnli-mm")
    assert [e.text_a for e in pmm.get_dev_examples(d)] == ["Your gift is appreciated."]
    assert [e.text_a for e in pmm.get_test_examples(d)] == ["C"]
    assert len(pmm.get_train_examples(d)) == 2


@pytest.mark.parametrize("task, labels, cols, row, expected", [
    ("qnli", ["entailment", "not_entailment"], ("index", "question", "sentence", "label"),
     ("0", "When did the third Digimon series begin?",
      'Unlike the two seasons before it, "Tamers" takes a darker approach.', "not_entailment"),
     ("When did the third Digimon series begin?",
      'Unlike the two seasons before it, "Tamers" takes a darker approach.', "not_entailment")),
    ("rte", ["entailment", "not_entailment"], ("index", "sentence1", "sentence2", "label"),
     ("0", "No Weapons of Mass Destruction Found in Iraq Yet.",
      '"Weapons" of Mass Destruction Found in Iraq.', "not_entailment"),
     ("No Weapons of Mass Destruction Found in Iraq Yet.",
      '"Weapons" of Mass Destruction Found in Iraq.', "not_entailment")),
    ("wnli", ["0", "1"], ("index", "sentence1", "sentence2", "label"),
     ("0", "I stuck a pin through a carrot. When I pulled the pin out, it had a hole.",
      "The carrot had a hole.", "1"),
     ("I stuck a pin through a carrot. When I pulled the pin out, it had a hole.",
      "The carrot had a hole.", "1")),
])
def test_index_pair_layouts(tmp_path, task, labels, cols, row, expected):
    d = str(tmp_path)
    _write(d, "train.tsv", [_row(*cols), _row(*row)])
    _write(d, "dev.tsv", [_row(*cols), _row("5", *row[1:])])
    _write(d, "test.tsv", [_row(*cols[:-1]), _row("0", row[1], row[2])])
    p = glue_data.get_processor(task.upper())
    assert p.get_labels() == labels
    assert p.get_train_examples(d) == [InputExample("train-0", *expected)]
    assert p.get_dev_examples(d) == [InputExample("dev-5", *expected)]
    assert p.get_test_examples(d) == [InputExample("test-0", row[1], row[2], labels[0])]


# ---------------------------------------------------------------------------
# Real files

def _count_rows(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f.read().splitlines() if line.strip())


def test_real_sst2_and_cola_dev(shared_data):
    sst_dir = os.path.join(shared_data, "glue", "SST-2")
    cola_dir = os.path.join(shared_data, "glue", "CoLA")
    if not os.path.isfile(os.path.join(sst_dir, "dev.tsv")):
        pytest.skip("GLUE SST-2 dev.tsv absent")
    sst = glue_data.get_processor("sst-2").get_dev_examples(sst_dir)
    assert len(sst) == _count_rows(os.path.join(sst_dir, "dev.tsv")) - 1  # header
    assert {e.label for e in sst} <= {"0", "1"} and {e.label for e in sst} == {"0", "1"}
    with open(os.path.join(sst_dir, "dev.tsv"), encoding="utf-8") as f:
        last = f.read().rstrip("\n").split("\n")[-1].split("\t")
    assert (sst[-1].text_a, sst[-1].label) == (last[0], last[1])
    assert all(e.text_b is None for e in sst)

    cola = glue_data.get_processor("cola").get_dev_examples(cola_dir)
    assert len(cola) == _count_rows(os.path.join(cola_dir, "dev.tsv"))  # no header
    assert {e.label for e in cola} == {"0", "1"}
    with open(os.path.join(cola_dir, "dev.tsv"), encoding="utf-8") as f:
        lines = f.read().rstrip("\n").split("\n")
    assert cola[0].text_a == lines[0].split("\t")[3]
    assert [e.label for e in cola] == [line.split("\t")[1] for line in lines]
    # Unacceptable sentences carry an original marker ("*", "?", "??", ...); acceptable
    # ones an empty one.
    markers = [line.split("\t")[2].strip() for line in lines]
    assert all((e.label == "1") == (marker == "") for e, marker in zip(cola, markers))
    assert len({e.guid for e in cola}) == len(cola)


# ---------------------------------------------------------------------------
# Errors

def test_registry_errors():
    with pytest.raises(ValueError, match="unknown GLUE task 'squad'.*cola.*wnli"):
        glue_data.get_processor("squad")
    assert glue_data.canonical_task_name("MNLI_MM") == "mnli-mm"
    assert glue_data.canonical_task_name("SST2") == "sst-2"


def test_bad_files_name_file_and_line(tmp_path):
    d = str(tmp_path)
    p = glue_data.get_processor("sst-2")
    with pytest.raises(GlueDataError, match=r"train\.tsv: file not found"):
        p.get_train_examples(d)
    path = _write(d, "dev.tsv", [_row("sentence", "label"), _row("good .", "1"),
                                 _row("bad", "extra", "0")])
    with pytest.raises(GlueDataError) as e:
        p.get_dev_examples(d)
    assert str(e.value) == f"{path}:3: 3 columns, expected 2 (GLUE sst-2 dev layout)"
    assert "\n" not in str(e.value)
    _write(d, "dev.tsv", [_row("sentence", "label"), _row("good .", "positive")])
    with pytest.raises(GlueDataError, match=r"dev\.tsv:2: label 'positive' is not one of 0, 1"):
        p.get_dev_examples(d)
    # A CoLA file given as SST-2: header lacks the column.
    _write(d, "dev.tsv", [_row("gj04", "1", "", "A sentence.")])
    with pytest.raises(GlueDataError, match=r"dev\.tsv:1: header has no column 'sentence'"):
        p.get_dev_examples(d)
    cola = glue_data.get_processor("cola")
    _write(d, "dev.tsv", [_row("gj04", "1", "", "A sentence."), _row("gj04", "1", "B.")])
    with pytest.raises(GlueDataError, match=r"dev\.tsv:2: 3 columns, expected 4"):
        cola.get_dev_examples(d)
    with open(os.path.join(d, "dev.tsv"), "wb") as f:
        f.write(b"gj04\t1\t\tok.\ngj04\t1\t\tbad \xff byte\n")
    with pytest.raises(GlueDataError, match=r"dev\.tsv:2: invalid UTF-8"):
        cola.get_dev_examples(d)
    stsb = glue_data.get_processor("sts-b")
    _write(d, "dev.tsv", [_row("index", "sentence1", "sentence2", "score"),
                          _row("0", "a", "b", "high")])
    with pytest.raises(GlueDataError, match=r"dev\.tsv:2: label 'high' is not a number"):
        stsb.get_dev_examples(d)


def test_crlf_and_blank_lines(tmp_path):
    d = str(tmp_path)
    with open(os.path.join(d, "dev.tsv"), "w", encoding="utf-8", newline="") as f:
        f.write("sentence\tlabel\r\nfine .\t1\r\n\r\nbad .\t0\r\n")
    ex = glue_data.get_processor("sst-2").get_dev_examples(d)
    assert [(e.text_a, e.label) for e in ex] == [("fine .", "1"), ("bad .", "0")]


# ---------------------------------------------------------------------------
# Features

class WhitespaceTokenizer:
    """Splits on spaces; ids from a small vocab (unknown -> 1)."""

    def __init__(self):
        self.vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}

    def tokenize(self, text):
        return text.split()

    def convert_tokens_to_ids(self, tokens):
        return [self.vocab.setdefault(t, len(self.vocab)) for t in tokens]


def test_features_layout_and_truncation():
    tok = WhitespaceTokenizer()
    examples = [
        InputExample("a", "x y", "z", "neutral"),
        InputExample("b", "a1 a2 a3 a4 a5 a6 a7", "b1 b2 b3", "entailment"),
        InputExample("c", "s1 s2 s3 s4 s5 s6 s7 s8 s9 s10", None, "contradiction"),
        InputExample("d", "p q r", "", "neutral"),
    ]
    labels = ["contradiction", "entailment", "neutral"]
    f = glue_data.convert_examples_to_features(examples, labels, 8, tok)
    ids = tok.convert_tokens_to_ids

    assert f[0].input_ids == ids(["[CLS]", "x", "y", "[SEP]", "z", "[SEP]"]) + [0, 0]
    assert f[0].input_mask == [1] * 6 + [0] * 2
    assert f[0].segment_ids == [0, 0, 0, 0, 1, 1, 0, 0]
    assert f[0].label_id == 2 and f[0].is_real_example
    # 10 tokens into 8 - 3 = 5: pops from the longer side (a) until a is not longer, then
    # from b on ties: a=3, b=2.
    assert f[1].input_ids == ids(["[CLS]", "a1", "a2", "a3", "[SEP]", "b1", "b2", "[SEP]"])
    assert f[1].input_mask == [1] * 8
    assert f[1].segment_ids == [0] * 5 + [1] * 3
    assert f[1].label_id == 1
    assert f[2].input_ids == ids(["[CLS]", "s1", "s2", "s3", "s4", "s5", "s6", "[SEP]"])
    assert f[2].segment_ids == [0] * 8 and f[2].label_id == 0
    # Empty text_b is a single sentence (as Google).
    assert f[3].input_ids == ids(["[CLS]", "p", "q", "r", "[SEP]"]) + [0, 0, 0]
    for feature in f:
        assert len(feature.input_ids) == len(feature.input_mask) == len(feature.segment_ids) == 8

    reg = glue_data.convert_examples_to_features(
        [InputExample("r", "a b", "c", 3.8), InputExample("s", "a", "b", 0.0)], [], 8, tok,
        is_regression=True)
    assert reg[0].label_id == 3.8 and isinstance(reg[0].label_id, float)
    assert reg[1].label_id == 0.0 and isinstance(reg[1].label_id, float)
    with pytest.raises(GlueDataError, match="'unknown' is not one of"):
        glue_data.convert_examples_to_features([InputExample("e", "a", None, "unknown")],
                                               labels, 8, tok)


def test_truncate_seq_pair_keeps_total_length():
    rng = np.random.default_rng(0)
    for _ in range(200):
        la, lb, limit = (int(v) for v in rng.integers(0, 30, 3))
        a, b = list(range(la)), list(range(100, 100 + lb))
        glue_data.truncate_seq_pair(a, b, limit)
        assert len(a) + len(b) == min(la + lb, limit)
        assert a == list(range(len(a))) and b == list(range(100, 100 + len(b)))  # pops the end
        if la + lb > limit:  # the longer side shrinks first; ties pop from b
            expected_a = min(la, max(limit - lb, (limit + 1) // 2))
            assert (len(a), len(b)) == (expected_a, limit - expected_a)


def test_real_tokenizer_pair(minilm_vocab):
    from data_prep.wordpiece.tokenization import FullTokenizer
    tok = FullTokenizer(minilm_vocab, do_lower_case=True)
    ex = InputExample("dev-0", "The new rights are nice enough", "Everyone really likes the "
                      "newest benefits", "neutral")
    (f,) = glue_data.convert_examples_to_features([ex], ["contradiction", "entailment",
                                                         "neutral"], 16, tok)
    tokens = ["[CLS]"] + tok.tokenize(ex.text_a) + ["[SEP]"] + tok.tokenize(ex.text_b) + ["[SEP]"]
    assert len(tokens) <= 16
    assert f.input_ids[:len(tokens)] == tok.convert_tokens_to_ids(tokens)
    assert f.input_ids[0] == tok.vocab["[CLS]"]
    assert f.input_ids[len(tokens) - 1] == tok.vocab["[SEP]"]
    n_a = len(tok.tokenize(ex.text_a)) + 2
    assert f.segment_ids == [0] * n_a + [1] * (len(tokens) - n_a) + [0] * (16 - len(tokens))
    assert f.label_id == 2


def test_padding_examples_and_tfrecord_roundtrip(tmp_path):
    import tensorflow as tf
    tok = WhitespaceTokenizer()
    examples = [InputExample(f"dev-{i}", "a b c"[:1 + 2 * i], None, str(i % 2)) for i in range(3)]
    padded, num_real = glue_data.pad_examples(examples, 4)
    assert num_real == 3 and len(padded) == 4 and isinstance(padded[3], PaddingInputExample)
    assert len(glue_data.pad_examples(examples, 3)[0]) == 3
    assert len(glue_data.pad_examples([], 8)[0]) == 0
    features = glue_data.convert_examples_to_features(padded, ["0", "1"], 6, tok)
    assert features[3].input_ids == [0] * 6 and features[3].input_mask == [0] * 6
    assert features[3].label_id == 0 and not features[3].is_real_example

    path = str(tmp_path / "eval.tf_record")
    assert glue_data.write_features_to_tfrecord(features, path) == 4
    records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    parsed = tf.io.parse_example(records, glue_data.feature_spec(6))
    np.testing.assert_array_equal(parsed["input_ids"], [f.input_ids for f in features])
    np.testing.assert_array_equal(parsed["input_mask"], [f.input_mask for f in features])
    np.testing.assert_array_equal(parsed["segment_ids"], [f.segment_ids for f in features])
    np.testing.assert_array_equal(parsed["label_ids"], [0, 1, 0, 0])
    np.testing.assert_array_equal(parsed["is_real_example"], [1, 1, 1, 0])
    assert parsed["label_ids"].dtype == tf.int64

    reg = glue_data.convert_examples_to_features(
        [InputExample("r", "a", "b", 3.8), PaddingInputExample()], [], 6, tok, is_regression=True)
    path = str(tmp_path / "stsb.tf_record")
    glue_data.write_features_to_tfrecord(reg, path, is_regression=True)
    records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    parsed = tf.io.parse_example(records, glue_data.feature_spec(6, is_regression=True))
    assert parsed["label_ids"].dtype == tf.float32
    np.testing.assert_allclose(parsed["label_ids"], [3.8, 0.0], rtol=1e-7)
    np.testing.assert_array_equal(parsed["is_real_example"], [1, 0])
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
