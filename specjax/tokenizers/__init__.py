"""Tokenizers: SentencePiece models and transformers-format `tokenizer.json`.

  sentencepiece  SentencePieceTokenizer (T5's spiece.model, vocabularies trained here)
  hf             HFTokenizer, load_tokenizer (either kind from a directory or file),
                 check_tokenizers_compatible
"""

from specjax.tokenizers.hf import HFTokenizer, check_tokenizers_compatible, load_tokenizer
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer

__all__ = ["SentencePieceTokenizer", "HFTokenizer", "load_tokenizer",
           "check_tokenizers_compatible"]
