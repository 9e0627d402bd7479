"""The programs: what `experiments/`, `benchmarks/` and the notebooks run.

Nothing in the library imports this package (the architecture contract in
`.importlinter`); its modules may use everything below them.

  leviathan, chen (+ chen_quality, chen_report)   the two paper reproductions
  long_context (+ _measure, _report)             long contexts x batch
  families                                         every drafter family on one target
  drafter_training, shakespeare_heads             training Medusa / EAGLE heads
  peers, peers_suite                               specjax against transformers
  seeds                                            the analysis exercises
  suffix                                           suffix drafting against prompt lookup
  runner                                           the standalone training job (experiments/train.py)
  demo                                             the demo (the picker and gate CLIs: specjax.cli)
  common, stages, report, speed, placement,       what the programs share: resumable
  notebooks                                        stages, reports, speed sweeps, meshes
"""
