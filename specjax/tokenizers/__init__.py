"""Tokenizers: `sentencepiece.SentencePieceTokenizer` (T5's spiece.model, vocabularies trained
here) and `hf` (`HFTokenizer` for a `tokenizer.json`, `load_tokenizer` for either kind,
`check_tokenizers_compatible`)."""

from specjax.tokenizers.hf import HFTokenizer, check_tokenizers_compatible, load_tokenizer
from specjax.tokenizers.sentencepiece import SentencePieceTokenizer

__all__ = ["SentencePieceTokenizer", "HFTokenizer", "load_tokenizer",
           "check_tokenizers_compatible"]
