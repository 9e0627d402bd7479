"""specjax: exact, batched speculative decoding as jitted pure functions.

Decoding (one jit, one `lax.while_loop`, donated static-shape caches):

  generate(model, params, prompts, prompt_lengths, max_new_tokens=..., ...)
  speculative_generate(target, target_params, draft, draft_params, prompts,
                       prompt_lengths, max_new_tokens=..., gamma=..., ...)
  plan_speculative(...)  # the same arguments: the SpeculativePlan the call runs

Models follow `protocol.LanguageModel`: `DecoderLM` (Chinchilla / Llama style), `T5` (v1.0 /
v1.1), `UnigramLM` / `BigramLM`. Drafts are draft models or drafters (`specjax.drafters`,
protocol `specjax.drafting`). `SamplingConfig`; `theory` (analytic results);
`parallel.sharding` (meshes); `import_hf_decoder` / `import_hf_t5` (transformers checkpoints
streamed into their shardings); `load_tokenizer`; `measure_beta` (α of a pair);
`tune_matvec_rows` (a decoder's CPU product path); `gamma="auto"` (`AdaptiveGamma`,
`calibrate_gamma_costs`, `Acceptance`); `clear_compiled` / `set_max_compiled_programs` (the
compiled-program cache). Package map and shape names: docs/architecture.md.
"""

from specjax import _platform

_platform.quiet_tpu_if_absent()   # before any backend: no libtpu noise where no TPU is

from specjax import drafters, parallel, theory  # noqa: E402
from specjax.adaptive import Acceptance, AdaptiveGamma
from specjax.api import (SpeculativePlan, generate, plan_speculative, prefill,
                         speculative_generate)
from specjax.calibration import GammaCosts, calibrate_gamma_costs
from specjax.checkpoints.hf_llama import export_hf_decoder, import_hf_decoder
from specjax.checkpoints.hf_t5 import export_hf_t5, import_hf_t5
from specjax.compiled import (clear_compiled, compiled_programs, max_compiled_programs,
                              set_max_compiled_programs)
from specjax.generation import (AutoregressiveDecoder, DecodeState, DecodeStats,
                                GenerationOutput, Prefill, SpeculativeDecoder)
from specjax.measure.beta import measure_beta
from specjax.measure.tuning import MatvecChoice, tune_matvec_rows
from specjax.models.decoder import DECODER_CONFIGS, DecoderConfig, DecoderLM, decoder_config
from specjax.models.ngram import BigramLM, UnigramLM
from specjax.models.t5 import T5, T5_CONFIGS, T5Config, t5_config
from specjax.parallel import sharding as _sharding  # noqa: F401  (specjax.parallel.sharding)
from specjax.protocol import LanguageModel, required_cache_len
from specjax.sampling import GREEDY, SamplingConfig, process_logits
from specjax.tokenizers import (HFTokenizer, SentencePieceTokenizer, check_tokenizers_compatible,
                                load_tokenizer)
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
    "clear_compiled", "compiled_programs", "max_compiled_programs", "set_max_compiled_programs",
    "AdaptiveGamma", "Acceptance", "GammaCosts", "calibrate_gamma_costs",
    "plan_speculative", "SpeculativePlan",
]
