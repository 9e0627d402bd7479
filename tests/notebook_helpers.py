"""Running a `colab/` notebook top to bottom in a test (shared by
test_notebooks and the reproduction modules, whose micro runs the
reproduction notebooks reuse), and running the notebooks' Colab-only cells
with Colab's modules faked (test_colab_notebooks; see `install_colab_fakes`)."""

import os

import pytest

from bench_helpers import one_device_xla_flags

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(ROOT, "colab")


def _execute(nb, cwd, allow_errors=False):
  """Runs `nb` top to bottom in `cwd`; a failing cell fails the test with its source
  (with `allow_errors`, execution goes on and the errors stay in the cells' outputs)."""
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   allow_errors=allow_errors,
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


# -----------------------------------------------------------------------------
# Colab's own modules, faked inside a notebook's kernel: the Colab-only cells
# (auth, Drive, a gs:// run folder) executed off Colab (tests/test_colab_notebooks.py).
#
# `colab_cells(...)` builds a notebook from a colab/ notebook's code cells with
# a first cell that calls `install_colab_fakes` in the kernel:
#   * `google.colab` (with `auth`, `drive`) in sys.modules, so
#     `notebooks.in_colab()` is True; `auth.authenticate_user()` and
#     `drive.mount(path)` record their calls (a mount onto a folder holding
#     files fails, as Colab's does);
#   * gs:// served from memory (tests/memgcs.py), every access recorded and,
#     before `authenticate_user()`, refused with PermissionError (as GCS
#     refuses an anonymous caller);
#   * `notebooks.runtime()` reports a TPU (the accelerator presets and
#     defaults: Drive on, the `quick` preset);
#   * the launch is rigged, not run: `leviathan.run` / `chen.run` record the
#     config they get (workdir, data cache) and write a small results folder
#     (`FAKE_RESULTS_MD`, `FAKE_PNG`, results.json) to <workdir>/results, on
#     gs:// or Drive, returning {"_out_dir": ...} as the real ones do.
# Form fields (`NAME = value  # @param`) are set the way Colab's form sets
# them, by rewriting that line (`fill_form`). Events are JSON lines in a log.
# -----------------------------------------------------------------------------

TESTS = os.path.join(ROOT, "tests")
FAKE_RESULTS_MD = "# Fake results\n\n| cell | speedup |\n|---|---|\n| gamma 3 | 1.5x |\n"


def _png_1x1() -> bytes:
  """A valid 1 x 1 RGB PNG (one red pixel)."""
  import struct
  import zlib

  def chunk(kind, data):
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
  return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
          + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


FAKE_PNG = _png_1x1()


def fill_form(source: str, **values) -> str:
  """`source` with each form field `NAME = ...  # @param ...` set to `repr(value)`, as
  Colab's form writes it; a field that is not there exactly once fails the test."""
  import re
  for name, value in values.items():
    pattern = re.compile(rf"^{name} = .*?(\s+# @param.*)$", re.M)
    hits = pattern.findall(source)
    assert len(hits) == 1, f"form field {name} appears {len(hits)} times"
    source = pattern.sub(lambda m: f"{name} = {value!r}{m.group(1)}", source)
  return source


def read_events(log_path: str) -> list:
  """The events `install_colab_fakes` recorded in `log_path`, in order."""
  import json
  if not os.path.exists(log_path):
    return []
  with open(log_path) as f:
    return [json.loads(line) for line in f]


def install_colab_fakes(log_path: str, drive_mount: str) -> None:
  """In a notebook's kernel: the fakes described above, recording to `log_path`,
  Drive mounted at `drive_mount` (`$SPECJAX_NOTEBOOK_DRIVE`). Safe to call again
  (a new scenario): the state, the log and the in-memory bucket start empty."""
  import json
  import sys
  import types

  import fsspec
  from etils import epath
  from etils.epath import backend, gpath

  import memgcs
  from experiments.programs import chen, leviathan, notebooks

  state = {"authenticated": False}
  open(log_path, "w").close()

  def log(**event):
    with open(log_path, "a") as f:
      f.write(json.dumps(event) + "\n")

  def authenticate_user(*args, **kwargs):
    state["authenticated"] = True
    log(event="authenticate_user")

  def mount(mountpoint, *args, **kwargs):
    log(event="mount", path=str(mountpoint))
    if os.path.isdir(mountpoint) and os.listdir(mountpoint):
      raise ValueError("Mountpoint must not already contain files")
    os.makedirs(os.path.join(mountpoint, "MyDrive"), exist_ok=True)

  colab = types.ModuleType("google.colab")
  colab.auth = types.ModuleType("google.colab.auth")
  colab.auth.authenticate_user = authenticate_user
  colab.drive = types.ModuleType("google.colab.drive")
  colab.drive.mount = mount
  sys.modules.update({"google.colab": colab, "google.colab.auth": colab.auth,
                      "google.colab.drive": colab.drive})
  try:
    import google  # the namespace package other google.* distributions share
  except ImportError:
    google = sys.modules["google"] = types.ModuleType("google")
    google.__path__ = []
  google.colab = colab
  os.environ["SPECJAX_NOTEBOOK_DRIVE"] = drive_mount

  class GuardedGCS(memgcs.MemGCS):
    """memgcs.MemGCS that records each access and refuses it before authenticate_user()."""

  def guarded(name):
    method = getattr(memgcs.MemGCS, name)

    def call(self, path, *args, **kwargs):
      log(event="gs", op=name, path=str(path), authenticated=state["authenticated"])
      if not state["authenticated"]:
        raise PermissionError(f"gs:// {name} {path}: anonymous caller (no authenticate_user)")
      return method(self, path, *args, **kwargs)
    return call
  for name in ("ls", "info", "mkdir", "makedirs", "rmdir", "_open", "cp_file", "cat_file",
               "pipe_file", "_rm", "rm", "isfile", "find", "modified", "created"):
    setattr(GuardedGCS, name, guarded(name))
  gpath._is_tf_installed = lambda: False  # epath would pick tf.io.gfile (as on Colab)
  for proto in ("gs", "gcs"):
    fsspec.register_implementation(proto, GuardedGCS, clobber=True)
  backend.fsspec_backend._get_filesystem.cache_clear()
  memgcs.clear()

  notebooks.runtime = lambda: {"backend": "tpu", "devices": 1, "kind": "TPU v5 lite (fake)",
                               "large": True}

  def fake_run(program):
    def run(cfg):
      log(event="run", program=program, workdir=cfg.workdir, cache_dir=cfg.data.cache_dir)
      out = epath.Path(cfg.workdir) / "results"
      out.mkdir(parents=True, exist_ok=True)
      (out / "results.md").write_text(FAKE_RESULTS_MD)
      (out / "speedup.png").write_bytes(FAKE_PNG)
      (out / "results.json").write_text(json.dumps({"program": program, "machine": "fake"}))
      return {"_out_dir": cfg.workdir + "/results"}
    return run
  leviathan.run, chen.run = fake_run("leviathan"), fake_run("chen")


def colab_cells(scenarios, tmp) -> tuple:
  """A notebook running each scenario in one kernel, one after another (one
  kernel start and one import of the library for all). `scenarios`: a list
  of (name, a colab/ notebook or a list of cell sources, {form field: value}). Each gets `%reset -f`,
  the fakes (log `<tmp>/<name>.jsonl`, Drive at `<tmp>/<name>/content/drive`),
  then the notebook's code cells with the form filled. Returns (notebook,
  {name: {"log", "drive", "cells": [(index in the composite, the original
  cell's source)] (the fakes' cell first)}})."""
  cells, where = [], {}
  for name, notebook, form in scenarios:
    log_path = os.path.join(str(tmp), f"{name}.jsonl")
    drive = os.path.join(str(tmp), name, "content", "drive")
    fakes = (f"%reset -f\nimport sys\nsys.path.insert(0, {TESTS!r})\nimport notebook_helpers\n"
             f"notebook_helpers.install_colab_fakes({log_path!r}, {drive!r})")
    if isinstance(notebook, str):
      src = nbformat.read(os.path.join(COLAB, notebook), as_version=4)
      sources = [c.source for c in src.cells if c.cell_type == "code"]
    else:
      sources = list(notebook)
    entry = {"log": log_path, "drive": drive, "cells": [(len(cells), fakes)]}
    cells.append(nbformat.v4.new_code_cell(fakes))
    left = dict(form)
    for original in sources:
      source = original
      fields = {k: v for k, v in left.items() if f"\n{k} = " in "\n" + source}
      if fields:
        source = fill_form(source, **fields)
        for k in fields:
          left.pop(k)
      entry["cells"].append((len(cells), original))
      cells.append(nbformat.v4.new_code_cell(source))
    assert not left, f"{notebook}: no form field {sorted(left)}"
    where[name] = entry
  return nbformat.v4.new_notebook(cells=cells), where


def run_colab_cells(scenarios, tmp, monkeypatch) -> tuple:
  """Executes `colab_cells(scenarios, tmp)` in one kernel (the notebooks'
  scratch folders under `<tmp>/scratch`); a failing cell does not stop the
  scenarios after it (each starts afresh: see `cell_error`). Returns
  (executed notebook, where)."""
  nb, where = colab_cells(scenarios, tmp)
  monkeypatch.setenv("SPECJAX_NOTEBOOK_WORKDIR", os.path.join(str(tmp), "scratch"))
  monkeypatch.setenv("SPECJAX_CACHE_DIR", os.path.join(str(tmp), "specjax-cache"))
  monkeypatch.delenv("SPECJAX_NOTEBOOK_SMOKE", raising=False)
  monkeypatch.setenv("XLA_FLAGS", one_device_xla_flags())
  monkeypatch.setenv("MPLBACKEND", "Agg")
  _execute(nb, COLAB, allow_errors=True)
  return nb, where


def cell_error(outputs) -> str:
  """The error an executed cell raised ("" when none): its name, value and
  traceback without the terminal colours."""
  import re
  for o in outputs:
    if o.get("output_type") == "error":
      text = "\n".join(o.get("traceback", [])) or f"{o.get('ename')}: {o.get('evalue')}"
      return re.sub(r"\x1b\[[0-9;]*m", "", text)[-3000:]
  return ""
