"""The `colab/` notebooks: no committed outputs, and each runs top to bottom.

CI executes every notebook with `SPECJAX_NOTEBOOK_SMOKE=1` (their smallest
settings): here, or (the reproduction notebooks) in the module whose micro
run they reuse. A failing cell fails the test with that cell's source.
"""

import glob
import os

import pytest

from notebook_helpers import COLAB, ROOT, _execute, nbformat, run_notebook

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


# The reproduction notebooks run their module's micro run again (every stage
# reused): tested in test_leviathan / test_chen beside that fixture.
REUSING = {"leviathan_t5.ipynb", "chen_chinchilla.ipynb"}


@pytest.fixture(scope="module")
def shared_workdir(tmp_path_factory):
  """One scratch root for this module's notebooks: the ones that train the same
  tiny pair (quickstart, families) train it once."""
  return tmp_path_factory.mktemp("notebooks")


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if os.path.basename(p) not in REUSING],
                         ids=os.path.basename)
def test_notebook_runs_top_to_bottom(path, monkeypatch, shared_workdir):
  run_notebook(os.path.basename(path), monkeypatch, shared_workdir)


def test_the_reproduction_notebooks_are_executed_beside_their_micro_runs():
  for name, module in (("leviathan_t5.ipynb", "test_leviathan.py"),
                       ("chen_chinchilla.ipynb", "test_chen.py")):
    with open(os.path.join(ROOT, "tests", module)) as f:
      assert f'run_notebook("{name}"' in f.read(), (name, module)


# -----------------------------------------------------------------------------
# Colab's norms: the runtime, the install, the workdir, visible progress.
# -----------------------------------------------------------------------------

ACCELERATED = {"leviathan_t5.ipynb", "chen_chinchilla.ipynb", "families.ipynb"}
RESUMABLE = {"leviathan_t5.ipynb", "chen_chinchilla.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_follows_colab_norms(path):
  name = os.path.basename(path)
  nb = nbformat.read(path, as_version=4)
  assert "colab" in nb.metadata, name
  if name in ACCELERATED:  # the badge opens a TPU runtime
    assert nb.metadata.get("accelerator") == "TPU", name
    assert nb.metadata["colab"].get("gpuType"), name
  code = [c.source for c in nb.cells if c.cell_type == "code"]
  setup = code[0]
  # %pip with a constraints file pinning the runtime's accelerator builds.
  assert "%pip install" in setup and "-c {KEEP}" in setup, name
  for pkg in ('"jax"', '"jaxlib"', '"libtpu"', '"torch"'):
    assert pkg in setup, (name, pkg)
  assert "metadata.version(pkg)" in setup, name
  # In a checkout with specjax importable (CI), nothing is cloned or installed.
  assert setup.index("import specjax") < setup.index("%pip install"), name
  assert "notebooks.show_progress()" in setup, name
  assert "notebooks.runtime_summary(" in code[1], name
  if name in RESUMABLE:  # executed with Colab's modules faked in test_colab_notebooks
    workdir = next(c for c in code if "WORKDIR =" in c)
    assert "notebooks.in_colab()" in workdir and "notebooks.workdir(" in workdir, name
    assert 'GCS_ROOT = ""' in workdir and "# @param" in workdir, name
    assert "DATA_CACHE =" in workdir and "notebooks.data_cache(WORKDIR)" in workdir, name
    auth = code[code.index(workdir) + 1]  # the cell after the settings: before any access
    assert "auth.authenticate_user()" in auth and "drive.mount(" in auth, name


def test_runtime_summary_says_how_to_switch_a_colab_cpu_runtime(monkeypatch):
  from experiments.programs import notebooks
  rt = {"backend": "cpu", "devices": 1, "kind": "cpu", "large": False}
  monkeypatch.setattr(notebooks, "in_colab", lambda: False)
  assert "Change runtime type" not in notebooks.runtime_summary(rt)
  monkeypatch.setattr(notebooks, "in_colab", lambda: True)
  text = notebooks.runtime_summary(rt)
  assert "Runtime → Change runtime type → TPU" in text and "CPU presets still run" in text
  tpu = dict(rt, backend="tpu", kind="TPU v5 lite", large=True)
  assert "Change runtime type" not in notebooks.runtime_summary(tpu)
  assert notebooks.workdir("run", "gs://bucket/specjax/") == "gs://bucket/specjax/run"
  assert notebooks.workdir("run", "") == notebooks.scratch("run")


def test_show_progress_puts_absl_info_on_stderr_outside_app_run():
  import subprocess
  import sys
  code = ("from absl import logging\n"
          "from experiments.programs import notebooks\n"
          "logging.info('before-the-helper')\n"
          "notebooks.show_progress()\n"
          "logging.info('after-the-helper')\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300, check=True)
  assert "after-the-helper" in out.stderr, out.stderr
  assert "before-the-helper" not in out.stderr + out.stdout
