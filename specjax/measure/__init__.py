"""Measuring drafts and runs (above the decoding API; the core imports none of it).

  beta         α = E[β] from exact distributions; α against KL over temperatures
  layers       choosing a layer-skip draft's layers by measured α
  timing       the one clock (`now`, `use_clock`), in-graph step times, `time_call`
  calls        the decode loops' model calls alone (the loop-overhead baseline)
  latency      TTFT / inter-token latency statistics from token emission times
  gate         the rollout gate: baseline vs drafter latencies and α, a verdict
  roofline     step bytes and the HBM roofline
  hlo          counting ops in compiled programs
  compiles     counting traces (a timed region must compile nothing)
  tuning       `tune_matvec_rows`: a decoder's CPU product path for this machine
  tensorboard  TensorBoard scalars and profiler traces
  provenance   what produced a result: commit, dirty flag, versions, CPU model, cores, command,
               UTC time (every results JSON's "provenance" record)

Speed claims live in the benchmarks and the results folders, never in timed tests.
"""
