"""Models following `specjax.protocol.LanguageModel`."""
from specjax.models.decoder import DECODER_CONFIGS, DecoderConfig, DecoderLM, decoder_config
from specjax.models.layers import KVCache
from specjax.models.ngram import BigramLM, UnigramLM, fit_ngram
from specjax.models.precision import cast_params
from specjax.models.t5 import T5, T5_CONFIGS, T5Cache, T5Config, t5_config
