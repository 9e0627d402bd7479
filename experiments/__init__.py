"""specjax's programs: the paper reproductions, comparisons and data they run.

Apart from the library (`specjax/`), which never imports this package (the
architecture contract in `.importlinter`):

  experiments/*.py        absl launchers, one per experiment (`python experiments/NAME.py
                          --config=configs/NAME.py:preset`)
  experiments/launch.py   their shared main (--config, logging, the compile-only branch)
  experiments/programs/   what the launchers, benchmarks and notebooks run
  experiments/data/       the offline data builders (`python -m experiments.data.build`)
"""
