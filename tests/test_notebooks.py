"""The `colab/` notebooks: no committed outputs, and each runs top to bottom.

CI executes every notebook with `SPECJAX_NOTEBOOK_SMOKE=1` (their smallest
settings). A failing cell fails the test with that cell's source.
"""

import glob
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(ROOT, "colab")
NOTEBOOKS = sorted(glob.glob(os.path.join(COLAB, "*.ipynb")))
EXPECTED = {"quickstart.ipynb", "leviathan_t5.ipynb", "chen_chinchilla.ipynb",
            "families.ipynb"}


def test_the_notebooks_exist_and_are_linked():
  names = {os.path.basename(p) for p in NOTEBOOKS}
  assert EXPECTED <= names, sorted(EXPECTED - names)
  with open(os.path.join(COLAB, "README.md")) as f:
    colab_readme = f.read()
  with open(os.path.join(ROOT, "README.md")) as f:
    main_readme = f.read()
  for name in names:
    badge = f"colab.research.google.com/github/specjax/specjax/blob/main/colab/{name}"
    assert badge in colab_readme, name
    assert badge in main_readme, name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_notebook_has_no_outputs(path):
  nb = nbformat.read(path, as_version=4)
  dirty = [i for i, c in enumerate(nb.cells)
           if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
  assert not dirty, (f"{os.path.basename(path)}: cells {dirty} hold outputs; clear them with "
                     "`jupyter nbconvert --clear-output --inplace colab/*.ipynb`")


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


def test_a_failing_cell_fails_with_its_source(tmp_path):
  nb = nbformat.v4.new_notebook(cells=[
      nbformat.v4.new_code_cell("x = 1"),
      nbformat.v4.new_code_cell("y = x + 1\nraise RuntimeError('cell two broke')"),
      nbformat.v4.new_code_cell("z = 3")])
  with pytest.raises(pytest.fail.Exception) as err:
    _execute(nb, str(tmp_path))
  msg = str(err.value)
  assert "raise RuntimeError('cell two broke')" in msg and "y = x + 1" in msg
  assert "cell two broke" in msg.split("--- error ---")[1]
  assert "z = 3" not in msg


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_top_to_bottom(path, monkeypatch, tmp_path):
  monkeypatch.setenv("SPECJAX_NOTEBOOK_SMOKE", "1")
  monkeypatch.setenv("SPECJAX_NOTEBOOK_WORKDIR", str(tmp_path))
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  monkeypatch.setenv("MPLBACKEND", "Agg")
  _execute(nbformat.read(path, as_version=4), COLAB)
