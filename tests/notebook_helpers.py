"""Running a `colab/` notebook top to bottom in a test (shared by
test_notebooks and the reproduction modules, whose micro runs the
reproduction notebooks reuse)."""

import os

import pytest

from bench_helpers import one_device_xla_flags

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(ROOT, "colab")


def _execute(nb, cwd):
  """Runs `nb` top to bottom in `cwd`; a failing cell fails the test with its source."""
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": cwd}})
  try:
    client.execute()
  except nbclient.exceptions.CellExecutionError as e:
    failing = next((c for c in nb.cells if c.cell_type == "code" and any(
        o.get("output_type") == "error" for o in c.get("outputs", []))), None)
    source = failing.source if failing is not None else "(cell not found)"
    pytest.fail(f"a cell failed:\n--- cell source ---\n{source}\n"
                f"--- error ---\n{str(e)[-3000:]}", pytrace=False)


def run_notebook(name, monkeypatch, workdir):
  """Executes colab/<name> with the smallest settings, its scratch folders
  under `workdir` (`SPECJAX_NOTEBOOK_WORKDIR`)."""
  monkeypatch.setenv("SPECJAX_NOTEBOOK_SMOKE", "1")
  monkeypatch.setenv("SPECJAX_NOTEBOOK_WORKDIR", str(workdir))
  monkeypatch.setenv("XLA_FLAGS", one_device_xla_flags())  # the real CPU device
  monkeypatch.setenv("MPLBACKEND", "Agg")
  _execute(nbformat.read(os.path.join(COLAB, name), as_version=4), COLAB)
