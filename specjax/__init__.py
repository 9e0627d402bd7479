"""specjax: exact, batched speculative decoding as jitted pure functions."""
from specjax.api import generate, speculative_generate, required_cache_len
from specjax.generation import GenerationOutput, DecodeStats
from specjax.sampling import SamplingConfig, GREEDY
