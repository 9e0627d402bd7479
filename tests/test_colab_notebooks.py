"""The reproduction notebooks' Colab-only cells, executed off Colab with Colab's modules faked.

One kernel runs every scenario (tests/notebook_helpers.py, `install_colab_fakes`): a fake
`google.colab` (auth, drive), gs:// from memory that refuses access before
`authenticate_user()`, a TPU runtime (so the accelerator defaults hold: Drive on, the `quick`
preset) and a rigged launch (the programs' `run` records its config and writes a small
results folder). So the settings, auth, launch and results cells run as on Colab, the
experiments do not. Also: the repository URL is one setting, and it agrees with the badges.
"""

import base64
import os
import re
import tomllib

import pytest

from notebook_helpers import (COLAB, FAKE_PNG, FAKE_RESULTS_MD, ROOT, cell_error, nbformat,
                              read_events, run_colab_cells)

REPRODUCTIONS = ("leviathan_t5.ipynb", "chen_chinchilla.ipynb")
BUCKET = "gs://specjax-colab-test/runs"

# The fakes themselves fail where Colab and GCS would: gs:// before authenticate_user(),
# a Drive mount onto a folder that holds files.
PROBE = '''
import os
from etils import epath
from google.colab import drive
try:
    epath.Path("gs://specjax-colab-test/probe").read_text()
    gs_refused = False
except PermissionError:
    gs_refused = True
os.makedirs("{busy}/x", exist_ok=True)
try:
    drive.mount("{busy}")
    mount_refused = False
except ValueError:
    mount_refused = True
assert gs_refused and mount_refused, (gs_refused, mount_refused)
'''


def _scenarios(tmp):
  out = [("probe", [PROBE.format(busy=os.path.join(str(tmp), "busy_mount"))], {})]
  for nb in REPRODUCTIONS:
    stem = nb[:-len(".ipynb")]
    out.append((f"{stem}-gcs", nb, {"GCS_ROOT": BUCKET}))
    out.append((f"{stem}-drive", nb, {}))  # the defaults on an accelerator: Drive
  return out


@pytest.fixture(scope="module")
def colab_runs(tmp_path_factory):
  """Every scenario executed once: {name: {"events", "outputs" (per original code cell),
  "drive", "scratch"}}."""
  tmp = tmp_path_factory.mktemp("colab")
  with pytest.MonkeyPatch.context() as mp:
    nb, where = run_colab_cells(_scenarios(tmp), tmp, mp)
  runs = {}
  for name, entry in where.items():
    runs[name] = {"events": read_events(entry["log"]), "drive": entry["drive"],
                  "scratch": os.path.join(str(tmp), "scratch"),
                  "cells": [(src, nb.cells[i].get("outputs", [])) for i, src in entry["cells"]]}
  return runs


def _run(colab_runs, name):
  """Scenario `name`'s run; a cell that raised fails the test with its source and error."""
  run = colab_runs[name]
  for source, outputs in run["cells"]:
    error = cell_error(outputs)
    if error:
      pytest.fail(f"{name}: a cell failed:\n--- cell source ---\n{source}\n--- error ---\n"
                  f"{error}", pytrace=False)
  return run


def _cell(run, marker):
  """(source, outputs) of the one code cell whose source holds `marker`."""
  hits = [c for c in run["cells"] if marker in c[0]]
  assert len(hits) == 1, (marker, len(hits))
  return hits[0]


def _text(outputs):
  return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


def _shows_the_results(run):
  """The results cell showed the results folder's markdown and PNG, read through epath."""
  _, outputs = _cell(run, 'OUT = epath.Path(results["_out_dir"])')
  shown = [o["data"] for o in outputs if o.get("output_type") == "display_data"]
  assert any(d.get("text/markdown") == FAKE_RESULTS_MD for d in shown), shown
  pngs = [base64.b64decode(d["image/png"]) for d in shown if "image/png" in d]
  assert pngs == [FAKE_PNG], len(pngs)
  text = _text(outputs)
  assert "results.md" in text and "speedup.png" in text and "machine, program" in text, text


def test_the_fakes_refuse_what_colab_and_gcs_refuse(colab_runs):
  events = _run(colab_runs, "probe")["events"]
  assert [e["event"] for e in events][:1] == ["gs"] and not events[0]["authenticated"]
  assert any(e["event"] == "mount" for e in events)


@pytest.mark.parametrize("notebook", REPRODUCTIONS)
def test_a_gs_run_folder_is_authenticated_before_any_access(colab_runs, notebook):
  stem = notebook[:-len(".ipynb")]
  run = _run(colab_runs, f"{stem}-gcs")
  events = run["events"]
  kinds = [e["event"] for e in events]
  assert kinds[0] == "authenticate_user", kinds[:5]
  assert kinds.count("authenticate_user") == 1 and "mount" not in kinds, kinds
  gs = [e for e in events if e["event"] == "gs"]
  assert gs and all(e["authenticated"] for e in gs)
  launched = [e for e in events if e["event"] == "run"]
  assert len(launched) == 1 and launched[0]["workdir"] == f"{BUCKET}/{stem}", launched
  # The results cell read the folder the launch wrote on gs://.
  assert any(e["op"] == "_open" and e["path"].endswith("results/speedup.png") for e in gs)
  _shows_the_results(run)
  # The data builders write local files: on gs:// the cache stays on the runtime, and says so.
  cache = launched[0]["cache_dir"]
  assert not cache.startswith("gs://") and cache.startswith(run["scratch"]), cache
  source, outputs = _cell(run, "WORKDIR = notebooks.workdir(")
  assert "a new runtime rebuilds it" in _text(outputs), _text(outputs)


@pytest.mark.parametrize("notebook", REPRODUCTIONS)
def test_a_drive_run_folder_is_mounted_and_holds_the_data_cache(colab_runs, notebook):
  stem = notebook[:-len(".ipynb")]
  run = _run(colab_runs, f"{stem}-drive")
  events = run["events"]
  kinds = [e["event"] for e in events]
  assert kinds[0] == "mount" and events[0]["path"] == run["drive"], events[:2]
  assert "authenticate_user" not in kinds and "gs" not in kinds, kinds
  launched = [e for e in events if e["event"] == "run"]
  assert len(launched) == 1
  workdir = launched[0]["workdir"]
  assert workdir == os.path.join(run["drive"], "MyDrive", "specjax", stem), workdir
  # The data cache lies in the run folder: a rerun after a disconnect finds it on Drive.
  cache = launched[0]["cache_dir"]
  assert cache.startswith(workdir + os.sep), (cache, workdir)
  assert os.path.isfile(os.path.join(workdir, "results", "speedup.png"))
  _shows_the_results(run)


# -----------------------------------------------------------------------------
# The repository URL: one setting, agreeing with every badge.
# -----------------------------------------------------------------------------

NOTEBOOKS = sorted(f for f in os.listdir(COLAB) if f.endswith(".ipynb"))
_REPO_URL = re.compile(r'^REPO_URL = "(https://github\.com/([\w.-]+/[\w.-]+))"  # @param', re.M)
_BADGE = re.compile(r"colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/main/colab/"
                    r"([\w.-]+\.ipynb)")


def _repo_url(nb):
  """(url, owner/name) of the notebook's one REPO_URL setting, in its first code cell."""
  code = [c.source for c in nb.cells if c.cell_type == "code"]
  hits = [m.groups() for src in code for m in _REPO_URL.finditer(src)]
  assert len(hits) == 1 and _REPO_URL.search(code[0]), hits
  return hits[0]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_repository_url_is_one_setting_used_by_the_clone(name):
  nb = nbformat.read(os.path.join(COLAB, name), as_version=4)
  url, _ = _repo_url(nb)
  code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
  assert "!git clone -q --depth 1 {REPO_URL} {REPO_DIR}" in code
  assert code.count("github.com") == 1, "the repository is named once (REPO_URL)"
  assert "SPECJAX_REPO" not in code


def test_the_repository_url_agrees_with_every_badge():
  repos = {}
  for name in NOTEBOOKS:
    nb = nbformat.read(os.path.join(COLAB, name), as_version=4)
    url, repo = _repo_url(nb)
    repos[name] = repo
    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert _BADGE.findall(md) == [(repo, name)], (name, _BADGE.findall(md))
  assert len(set(repos.values())) == 1, repos
  repo = next(iter(repos.values()))
  for readme in (os.path.join(COLAB, "README.md"), os.path.join(ROOT, "README.md")):
    with open(readme) as f:
      badges = _BADGE.findall(f.read())
    assert {n for _, n in badges} >= set(NOTEBOOKS), (readme, badges)
    assert {r for r, _ in badges} == {repo}, (readme, badges)
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    urls = tomllib.load(f).get("project", {}).get("urls", {})
  assert urls, "pyproject.toml names the repository in [project.urls]"
  for key, value in urls.items():  # the repository, or pages inside it
    if "github.com/" in value:
      path = value.split("github.com/", 1)[1].rstrip("/").removesuffix(".git")
      assert path == repo or path.startswith(repo + "/"), (key, value)


# -----------------------------------------------------------------------------
# The helpers behind the cells.
# -----------------------------------------------------------------------------

def test_drive_and_data_cache_helpers(monkeypatch):
  from experiments.programs import notebooks
  monkeypatch.delenv("SPECJAX_NOTEBOOK_DRIVE", raising=False)
  assert notebooks.drive_mount() == "/content/drive"
  assert notebooks.drive_root() == "/content/drive/MyDrive/specjax"
  assert notebooks.on_drive("/content/drive/MyDrive/specjax/run")
  assert not notebooks.on_drive("/content/drive2/run") and not notebooks.on_drive("gs://b/run")
  monkeypatch.setenv("SPECJAX_NOTEBOOK_DRIVE", "/tmp/fake_drive")
  assert notebooks.drive_root() == "/tmp/fake_drive/MyDrive/specjax"
  assert notebooks.data_cache("/tmp/fake_drive/MyDrive/specjax/run") == \
      "/tmp/fake_drive/MyDrive/specjax/run/data_cache"
  monkeypatch.setenv("SPECJAX_NOTEBOOK_WORKDIR", "/tmp/scratch_root")
  assert notebooks.data_cache("gs://b/specjax/run") == "/tmp/scratch_root/specjax_nb_data_cache"
