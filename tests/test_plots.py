"""Library plots draw on bare `matplotlib.figure.Figure`s: calling them never
switches matplotlib's backend (a notebook's inline plots keep showing), they
write their PNG and return the Figure."""

import os

import pytest

matplotlib = pytest.importorskip("matplotlib")

from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

from experiments.programs import families, long_context_report, report, seeds


@pytest.fixture
def svg_backend():
  """The backend set to "svg" (not Agg, which the old code forced), restored after."""
  before = matplotlib.get_backend()
  matplotlib.use("svg")
  try:
    yield "svg"
  finally:
    matplotlib.use(before)


def _plots(tmp):
  rows = [{"drafter": "autoregressive", "tokens_per_call": 1.0, "speedup": 1.0},
          {"drafter": "prompt lookup", "tokens_per_call": 1.8, "speedup": 1.3}]
  fam = {"tasks": {"summarize": [{"temperature": 0.0, "batch": 1, "rows": rows}]}}
  lc = {"settings": ["greedy"], "drafts": ["window"], "variants": [],
        "cells": [{"setting": "greedy", "context": c, "batch": b,
                   "summary": {"window": {"speedup": 1.0 + 0.1 * b}}}
                  for c in (128, 256) for b in (1, 2)]}
  return {
      "lines.png": lambda p: report.plot_lines({"a": {"x": ([1, 2], [1.0, 2.0])}}, p, "γ", "s",
                                               1.0),
      "bars.png": lambda p: report.plot_bars({"g1": {"s": 0.5}, "g2": {"s": 0.7}}, p, "α"),
      "families.png": lambda p: families.plot(fam, p),
      "surface.png": lambda p: long_context_report.plot(lc, p),
      "tokens.png": lambda p: seeds._plot_tokens(seeds.tokens_per_call_exercise(n_max=6), p),
      "alpha.png": lambda p: seeds._plot_alpha_for_speedup(seeds.alpha_for_speedup_exercise(), p),
      "mix.png": lambda p: seeds._plot_mix(seeds.traffic_mix_exercise(), p),
      "memory.png": lambda p: seeds._plot_memory(seeds.memory_exercise(), p),
  }


def test_plots_keep_the_backend_write_png_and_return_the_figure(tmp_path, svg_backend):
  for name, plot in _plots(tmp_path).items():
    path = os.path.join(tmp_path, name)
    fig = plot(path)
    assert matplotlib.get_backend() == svg_backend, name
    assert isinstance(fig, Figure), name
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
  assert sorted(os.listdir(tmp_path)) == sorted(_plots(tmp_path))  # no temporary files left


def test_the_library_never_selects_a_backend():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  offenders = []
  for d, _, files in os.walk(os.path.join(root, "specjax")):
    for f in files:
      if f.endswith(".py"):
        with open(os.path.join(d, f), encoding="utf-8") as src:
          text = src.read()
        if "matplotlib.use(" in text or "import matplotlib.pyplot" in text:
          offenders.append(f)
  assert not offenders, offenders
