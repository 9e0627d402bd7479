"""The default data on a host that cannot build it: `experiments.data.host_problems` names
what is missing (apt-get, root — with the one `sudo` command —, apt's index, German catalogs,
the Python packages that carry them), and the reproductions stop before any work with a
`DataHostError` naming the config fields of the alternatives — unless the data is already
cached, another source is configured, or the default ("auto") falls back to the catalogs and
descriptions inside installed Python packages, which a host without apt builds from.

No test reads the machine's own Python packages: `no_installed_packages` (autouse) leaves
none, and the PyPI tests install a fake one (tests/test_data_pypi.py)."""

import os
import shutil

import pytest

from configs import chen_chinchilla as chen_config
from configs import leviathan_t5 as lev_config
from experiments import data
from experiments.data import debian, gettext_mo
from experiments.data import tasks
from experiments.programs import chen, leviathan
from experiments.programs.common import DataHostError
from experiments.data import pypi
from data_helpers import lists_dir
from test_data_pypi import use_distributions, write_distribution

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "data")
_which = shutil.which


@pytest.fixture(autouse=True)
def no_installed_packages(monkeypatch):
  """No installed Python package ships catalogs or descriptions (tests add fakes)."""
  use_distributions(monkeypatch, [])


@pytest.fixture
def no_apt(monkeypatch):
  """A host without apt (not Debian/Ubuntu): `shutil.which` finds no apt-get / apt-cache."""
  monkeypatch.setattr(shutil, "which", lambda name, *a, **k:
                      None if name.startswith("apt") else _which(name, *a, **k))


@pytest.fixture
def apt_not_root(monkeypatch):
  """A Debian host, run as an ordinary user."""
  monkeypatch.setattr(shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}")
  monkeypatch.setattr(os, "geteuid", lambda: 1000, raising=False)


def _catalog_root(tmp_path):
  root = tmp_path / "locale"
  (root / "de" / "LC_MESSAGES").mkdir(parents=True)
  (root / "de" / "LC_MESSAGES" / "app.mo").write_bytes(gettext_mo.encode_mo(
      [gettext_mo.MoEntry("Open file", "Datei öffnen"), gettext_mo.MoEntry("Print", "Drucken")]))
  return str(root)


# -----------------------------------------------------------------------------
# experiments.data.host_problems
# -----------------------------------------------------------------------------


def test_apt_update_without_apt_get(tmp_path, no_apt):
  assert data.host_problems("summarize_debian", tmp_path / "c", lists_dir=str(tmp_path),
                            apt_update=True, source="apt") == [
      "this host has no apt-get (it is not Debian/Ubuntu, or apt-get is not on PATH)"]


def test_apt_update_without_root(tmp_path, apt_not_root):
  (p,) = data.host_problems("summarize_debian", tmp_path / "c", lists_dir=str(tmp_path),
                            apt_update=True, source="apt")
  assert p == ("`apt-get update` needs root and this process runs as uid 1000: run "
               "`sudo apt-get update -o Acquire::Languages=en` once (later builds read apt's "
               "lists without root)")
  # The default source says the same, and that no Python package has descriptions either.
  (apt, py) = data.host_problems("summarize_debian", tmp_path / "c", lists_dir=str(tmp_path),
                                 apt_update=True)
  assert apt == "source apt: " + p and py.startswith("source pypi: ")


def test_descriptions_missing_and_no_update(tmp_path):
  (p,) = data.host_problems("summarize_debian", tmp_path / "c", lists_dir=str(tmp_path),
                            source="apt")
  assert "no *_i18n_Translation-en* index" in p and "apt_update is off" in p
  assert "sudo apt-get update -o Acquire::Languages=en" in p


def test_descriptions_present_need_nothing(tmp_path, no_apt):
  assert data.host_problems("summarize_debian", tmp_path / "c",
                            lists_dir=lists_dir(tmp_path)) == []


def test_catalogs_downloads_need_apt_get_local_ones_do_not(tmp_path, no_apt):
  roots = (_catalog_root(tmp_path),)
  assert data.host_problems("translate_en_de", tmp_path / "c", locale_roots=roots) == []
  (p,) = data.host_problems("translate_en_de", tmp_path / "c", locale_roots=roots,
                            max_packages=3, source="debian")
  assert "no apt-get" in p
  (p,) = data.host_problems("translate_en_de", tmp_path / "c", source="debian",
                            locale_roots=(str(tmp_path / "empty"),))
  assert "no German gettext catalogs" in p and "max_packages is 0" in p


def test_another_source_needs_nothing(tmp_path, no_apt):
  for task in ("summarize_debian", "translate_en_de"):
    assert data.host_problems(task, tmp_path / "c", source="jsonl:/some/file.jsonl",
                              lists_dir=str(tmp_path), apt_update=True,
                              locale_roots=(str(tmp_path),), max_packages=40) == []


def test_a_cached_build_needs_nothing(tmp_path, monkeypatch):
  lists, cache = lists_dir(tmp_path), tmp_path / "cache"
  assert not data.is_built("summarize_debian", cache, lists_dir=lists)
  data.build_task("summarize_debian", cache, lists_dir=lists, show_progress=False)
  assert data.is_built("summarize_debian", cache, lists_dir=lists)
  for f in os.listdir(lists):  # the host loses its index and apt-get: the cache suffices
    os.remove(os.path.join(lists, f))
  monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
  assert data.host_problems("summarize_debian", cache, lists_dir=lists, apt_update=True) == []
  # Other options are another build: not cached, so the host is checked.
  assert data.host_problems("summarize_debian", cache, lists_dir=lists, apt_update=True,
                            min_input_words=20)


# -----------------------------------------------------------------------------
# The main job (experiments/leviathan_t5.py ... :quick) and the Chen reproduction.
# -----------------------------------------------------------------------------


def _quick(tmp_path):
  cfg = lev_config.get_config("quick")
  cfg.workdir = str(tmp_path / "work")
  cfg.data.cache_dir = str(tmp_path / "data_cache")
  return cfg


def test_main_job_stops_before_anything_on_a_host_without_apt(tmp_path, no_apt, monkeypatch):
  monkeypatch.setattr(debian, "translation_en_files", lambda *a, **k: [])
  cfg = _quick(tmp_path)
  with pytest.raises(DataHostError) as e:
    leviathan.run(cfg)
  msg = str(e.value)
  assert "from this host's Debian catalogs (apt-get; `sudo apt-get update" in msg
  assert "from the catalogs and READMEs inside installed Python packages" in msg
  # the quick default, from neither source
  assert "summarize_debian_lead: source apt: this host has no apt-get" in msg
  assert "source pypi: no installed Python package ships a German gettext catalog" in msg
  assert 'pip install "specjax[experiments]"' in msg
  for field in ("--config.data.translate_source=jsonl:PATH",
                "--config.data.summarize_source=jsonl:PATH",
                "--config.data.translate_task=wmt14_translate/de-en",
                "--config.data.summarize_task=cnn_dailymail", "source=tfds",
                "--config.data.cache_dir"):
    assert field in msg, field
  assert not os.path.exists(cfg.workdir)  # nothing started: not even the workdir


def test_main_job_without_root_names_root(tmp_path, apt_not_root, monkeypatch):
  monkeypatch.setattr(debian, "translation_en_files", lambda *a, **k: [])
  with pytest.raises(DataHostError, match="needs root and this process runs as uid 1000"):
    leviathan.preflight_data(_quick(tmp_path))


def test_main_job_with_its_data_cached_needs_no_apt(tmp_path, no_apt, monkeypatch):
  monkeypatch.setattr(debian, "translation_en_files", lambda *a, **k: [])
  cfg = _quick(tmp_path)
  records = [{"inputs": f"word{i} " * 6 + f"more{i}", "targets": f"short {i}"} for i in range(40)]
  for task, opts in leviathan.task_options(cfg).items():  # built on Debian, the cache copied
    debian_source = {"translate_en_de": "debian"}.get(task, "apt")
    with monkeypatch.context() as m:
      m.setattr(tasks.get_builder(task), "examples",
                lambda *a, **k: (iter(records), "copied", {}))
      data.build_task(task, cfg.data.cache_dir, show_progress=False,
                      **{**opts, "source": debian_source})
  leviathan.preflight_data(cfg)  # no error
  for task, opts in leviathan.task_options(cfg).items():  # and the builds use that cache
    assert data.build_task(task, cfg.data.cache_dir, show_progress=False, **opts).reused


def test_main_job_on_a_host_without_apt_builds_from_python_packages(tmp_path, no_apt,
                                                                    monkeypatch):
  monkeypatch.setattr(debian, "translation_en_files", lambda *a, **k: [])
  monkeypatch.setattr(debian, "local_catalogs", lambda *a, **k: [])
  use_distributions(monkeypatch, [write_distribution(str(tmp_path / "site"))])
  cfg = _quick(tmp_path)
  leviathan.preflight_data(cfg)  # no error: the default falls back to the PyPI source
  expected = {"translate_en_de": 13, "summarize_debian_lead": 3}  # the fake package's
  for task, opts in leviathan.task_options(cfg).items():
    res = data.build_task(task, cfg.data.cache_dir, show_progress=False, **opts)
    assert res.meta["source_choice"]["used"] == "pypi", task
    assert res.meta["config"]["source"] == "pypi"
    assert sum(res.meta["counts"].values()) == expected.pop(task)
  assert not expected
  chen_cfg = chen_config.get_config("quick")
  chen_cfg.data.cache_dir = str(tmp_path / "chen_cache")
  chen.preflight_data(chen_cfg)


def test_main_job_from_local_files_needs_no_apt(tmp_path, no_apt, monkeypatch):
  monkeypatch.setattr(debian, "translation_en_files", lambda *a, **k: [])
  cfg = _quick(tmp_path)
  cfg.data.translate_source = "jsonl:/data/en_de.jsonl"
  cfg.data.summarize_source = "jsonl:/data/summaries.jsonl"
  leviathan.preflight_data(cfg)
  cfg.data.translate_task, cfg.data.translate_source = "wmt14_translate/de-en", "tfds"
  cfg.data.summarize_task, cfg.data.summarize_source = "cnn_dailymail", "tfds"
  leviathan.preflight_data(cfg)


def test_chen_names_its_alternatives(tmp_path, no_apt, monkeypatch):
  monkeypatch.setattr(debian, "translation_en_files", lambda *a, **k: [])
  cfg = chen_config.get_config("quick")
  cfg.data.cache_dir = str(tmp_path / "data_cache")
  with pytest.raises(DataHostError) as e:
    chen.preflight_data(cfg)
  assert "--config.data.summarize_source=jsonl:PATH" in str(e.value)
  assert "--config.data.summarize_task=xsum" in str(e.value)
  cfg.data.summarize_source = "jsonl:/data/xsum.jsonl"
  chen.preflight_data(cfg)
