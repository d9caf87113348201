"""Google-compatible BERT in TensorFlow graph mode: config, encoder, pre-training heads."""
from modeling.config import BertConfig, ConfigError, named_config
from modeling.bert_model import BertModel
from modeling.pretraining_heads import gather_indexes, masked_lm_output, next_sentence_output

__all__ = ["BertConfig", "BertModel", "ConfigError", "named_config", "gather_indexes",
           "masked_lm_output", "next_sentence_output"]
