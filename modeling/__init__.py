"""Google-compatible BERT in TensorFlow graph mode: config, encoder, pre-training heads."""
from modeling.config import BertConfig, ConfigError, named_config
from modeling.bert_model import BertModel, PackedRows
from modeling.core import gather_indexes
from modeling.pretraining_heads import masked_lm_output, next_sentence_output

__all__ = ["BertConfig", "BertModel", "PackedRows", "ConfigError", "named_config", "gather_indexes",
           "masked_lm_output", "next_sentence_output"]
