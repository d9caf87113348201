"""Whether a SQuAD file is data of the version a run is set for (--version_2_with_negative),
checked before the file trains or is predicted: data of the other version either trains a
model that can never give some of its answers or fails after predicting."""
from absl import logging

from finetuning.squad_eval import SquadFileError, dataset_articles, iter_questions

VERSION_2_FLAG = "--version_2_with_negative"


def check_version(dataset_json, version_2_with_negative, is_training, source):
    """Raises SquadFileError (one line: the file, the first question that shows it, the flag)
    when `dataset_json` is data of the other SQuAD version than the run's; warns where the
    run is still sound. Returns nothing.

    * v2.0 data without --version_2_with_negative: a question with ``is_impossible: true``,
      or (to score) with no answer in a file whose other questions have answers. Refused:
      trained, its unanswerable questions are taught as [CLS] answers that v1.1 prediction
      can never give; predicted, v1.1 can never answer "no answer" and its metric is not
      defined for such a question.
    * v1.1 data (no question carries ``is_impossible``) with --version_2_with_negative:
      refused for training, as Google's and NVIDIA's v2.0 readers refuse a question without
      ``is_impossible`` (a mixed file, where some questions carry it, reads the others as
      answerable); predicted and scored, one warning: the v2.0 metric counts every "no
      answer" as wrong on such data, which is true but rarely meant.
    """
    questions = list(iter_questions(dataset_articles(dataset_json, source), source))
    if not version_2_with_negative:
        scored = any(qa.get("answers") for qa in questions)
        for qa in questions:
            if qa.get("is_impossible"):
                raise SquadFileError(source, f"question {qa['id']} is unanswerable "
                                             "(is_impossible: true): SQuAD v2.0 data; pass "
                                             f"{VERSION_2_FLAG}")
            if scored and not is_training and not qa.get("answers"):
                raise SquadFileError(source, f"question {qa['id']} has no answer while others "
                                             f"have: SQuAD v2.0 data? pass {VERSION_2_FLAG}")
        return
    if not questions or any("is_impossible" in qa for qa in questions):
        return
    first = questions[0]["id"]
    if is_training:
        raise SquadFileError(source, f"SQuAD v1.1 data: no question says whether it is "
                                     f"answerable (no 'is_impossible', the first: {first}); "
                                     f"drop {VERSION_2_FLAG} for v1.1 data, or train on "
                                     "v2.0 data")
    if any(qa.get("answers") for qa in questions):
        logging.warning("%s: SQuAD v1.1 data (no 'is_impossible', the first question: %s) "
                        "predicted with %s: every 'no answer' prediction is scored wrong; "
                        "drop the flag for v1.1 data", source, first, VERSION_2_FLAG)
