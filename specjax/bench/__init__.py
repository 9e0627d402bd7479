"""Benchmark plumbing, kept apart from the core library.

  timing       the one clock (`now`, `use_clock`), in-graph step times
               (`step_times`, `StepTimer`), `time_call`, `predicted_speedup`
  calls        the decode loops' model calls alone (loop-overhead baseline)
  peers        specjax vs transformers: pairs, runners, latencies, memory
  peers_suite  the whole peers benchmark behind `benchmarks/peers_bench.py`
  roofline     step bytes and the HBM roofline (`benchmarks/gpu_roofline.py`)
  tuning       `tune_matvec_rows`: a decoder's CPU product path for this machine
               (re-exported as `specjax.tune_matvec_rows`)

Speed claims live in `benchmarks/` (JSON + markdown), never in timed tests.
"""
