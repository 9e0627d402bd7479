"""specjax: exact, batched speculative decoding as jitted pure functions.

Decoding (one jit, one `lax.while_loop`, donated static-shape caches):

  generate(model, params, prompts, prompt_lengths, max_new_tokens=..., ...)
  speculative_generate(target, target_params, draft, draft_params, prompts,
                       prompt_lengths, max_new_tokens=..., gamma=..., ...)

Models follow `specjax.protocol.LanguageModel`: `DecoderLM` (Chinchilla /
Llama style), `T5` (v1.0 / v1.1), `UnigramLM` / `BigramLM`. Sampling choices
are `SamplingConfig`s; `specjax.theory` has the analytic results;
`specjax.sharding` places everything on a `jax.sharding` mesh;
`import_hf_decoder` / `import_hf_t5` stream transformers-format checkpoints
(Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, T5) straight into their shardings;
`load_tokenizer` reads a `tokenizer.json` or a SentencePiece model;
`tune_matvec_rows` picks a decoder's CPU product path for this machine.

Shape names: B batch, P prompt, T tokens per call, S cache slots, V vocab,
L layers, H heads, K kv heads, D head dim, E width, G = gamma.
"""

from specjax import theory
from specjax.analysis import measure_beta
from specjax.api import generate, prefill, required_cache_len, speculative_generate
from specjax.generation import (AutoregressiveDecoder, DecodeState, DecodeStats,
                                GenerationOutput, Prefill, SpeculativeDecoder)
from specjax.models.decoder import DECODER_CONFIGS, DecoderConfig, DecoderLM, decoder_config
from specjax.models.ngram import BigramLM, UnigramLM
from specjax.models.t5 import T5, T5_CONFIGS, T5Config, t5_config
from specjax.protocol import LanguageModel
from specjax.sampling import GREEDY, SamplingConfig, process_logits
from specjax.bench.tuning import MatvecChoice, tune_matvec_rows
from specjax.checkpoints.hf_llama import export_hf_decoder, import_hf_decoder
from specjax.checkpoints.hf_t5 import export_hf_t5, import_hf_t5
from specjax.hf_tokenizer import HFTokenizer, check_tokenizers_compatible, load_tokenizer
from specjax.tokenizer import SentencePieceTokenizer
from specjax.verify import rejection_verify

__version__ = "0.1.0"

__all__ = [
    "generate", "speculative_generate", "prefill", "Prefill", "required_cache_len",
    "GenerationOutput", "DecodeStats", "DecodeState", "AutoregressiveDecoder",
    "SpeculativeDecoder", "SamplingConfig", "GREEDY",
    "process_logits", "rejection_verify", "measure_beta", "LanguageModel", "DecoderLM",
    "DecoderConfig", "decoder_config", "DECODER_CONFIGS", "T5", "T5Config", "t5_config",
    "T5_CONFIGS", "UnigramLM", "BigramLM", "theory", "tune_matvec_rows", "MatvecChoice",
    "import_hf_decoder", "export_hf_decoder", "import_hf_t5", "export_hf_t5", "HFTokenizer",
    "SentencePieceTokenizer", "load_tokenizer", "check_tokenizers_compatible",
]
