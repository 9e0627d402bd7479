"""The documentation site (mkdocs.yml, docs/): `mkdocs build --strict` passes, so a broken link
between pages, a link out of docs/ to a file the repository does not have, a page left out of
the nav or a docstring the API reference cannot read fails CI. The API pages hold the public
functions' docstrings; a copy of the config over pages with broken links fails (the negative
control); the hooks of docs/hooks/ are tested on their own."""

import fcntl
import html
import importlib
import importlib.util
import inspect
import logging
import os
import re
import subprocess
import sys
import textwrap
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOKS = os.path.join(ROOT, "docs", "hooks")
MODULES = ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "griffe")


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # its parent package is missing
    return False


@pytest.fixture(scope="module", autouse=True)
def docs_tools():
  missing = [m for m in MODULES if not _installed(m)]
  if missing:
    pytest.fail(f"{', '.join(missing)} not installed: the docs build needs the [docs] extra "
                "(pip install -e \".[docs]\"; [test] includes it)", pytrace=False)


def _mkdocs_build(site_dir, config=None) -> subprocess.CompletedProcess:
  """`mkdocs build --strict` of mkdocs.yml, or of the config text `config` (read from stdin, so
  that its relative paths resolve from the repository root as mkdocs.yml's do)."""
  cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir),
         "--config-file", "mkdocs.yml" if config is None else "-"]
  return subprocess.run(cmd, input=config, capture_output=True, text=True, cwd=ROOT, timeout=600)


def _text(path) -> str:
  """A built page's text: tags dropped, entities decoded, whitespace collapsed."""
  with open(path, encoding="utf-8") as f:
    page = f.read()
  return " ".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())


def _summary(obj) -> str:
  """The first paragraph of `obj`'s docstring as the page shows it (no backticks)."""
  first = inspect.getdoc(obj).split("\n\n", 1)[0]
  return " ".join(first.replace("`", "").split())


def _load(name: str):
  spec = importlib.util.spec_from_file_location(name, os.path.join(HOOKS, name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _config() -> dict:
  import yaml  # mkdocs' own dependency
  with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
    return yaml.safe_load(f)


@pytest.fixture(scope="module")
def site(tmp_path_factory, request):
  """The site built from mkdocs.yml, once per run: xdist's workers share the folder above their
  own temporary folders, and the first to take the lock builds."""
  shared = tmp_path_factory.getbasetemp()
  if hasattr(request.config, "workerinput"):
    shared = shared.parent
  out = shared / "docs_site"
  with open(shared / "docs_site.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (shared / "docs_site.ok").exists():
      res = _mkdocs_build(out)
      assert res.returncode == 0, res.stderr[-6000:]
      (shared / "docs_site.ok").touch()
  return out


def test_the_site_builds_with_warnings_as_errors(site):
  config = _config()
  assert config["strict"] is True and config["docs_dir"] == "docs"
  # Every check stays on: a broken link, anchor or page left out of the nav is a warning.
  assert set(config["validation"].values()) == {"warn"}, config["validation"]
  assert os.path.exists(site / "index.html") and os.path.exists(site / "api" / "index.html")


# (page, object): each object's docstring must be on its package's API page, under its anchor.
DOCUMENTED = [
    ("specjax", "specjax.generate"),
    ("specjax", "specjax.speculative_generate"),
    ("specjax", "specjax.plan_speculative"),
    ("specjax", "specjax.SamplingConfig"),
    ("specjax", "specjax.SpeculativeDecoder"),
    ("specjax", "specjax.DecodeStats"),
    ("specjax", "specjax.Acceptance"),
    ("drafters", "specjax.drafters.PromptLookup"),
    ("models", "specjax.models.DecoderLM"),
    ("training", "specjax.training.train_model"),
    ("checkpoints", "specjax.checkpoints.import_hf_decoder"),
    ("tokenizers", "specjax.tokenizers.load_tokenizer"),
    ("parallel", "specjax.parallel.sharding.make_mesh"),
    ("aot", "specjax.aot.run_aot"),
    ("measure", "specjax.measure.beta.measure_beta"),
]


@pytest.mark.parametrize("page,path", DOCUMENTED, ids=[p for _, p in DOCUMENTED])
def test_the_api_pages_hold_the_docstrings(site, page, path):
  module, name = path.rsplit(".", 1)
  obj = getattr(importlib.import_module(module), name)
  html_path = site / "api" / page / "index.html"
  with open(html_path, encoding="utf-8") as f:
    assert f'id="{path}"' in f.read(), (page, path)
  assert _summary(obj) in _text(html_path), (page, path, _summary(obj))


def test_links_out_of_docs_point_at_the_repository_on_github(site):
  try:
    import tomllib
  except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    homepage = tomllib.load(f)["project"]["urls"]["Homepage"]
  config = _config()
  assert config["repo_url"] == homepage
  repo, ref = homepage.rstrip("/"), config["extra"]["source_ref"]
  with open(site / "where-it-pays" / "index.html", encoding="utf-8") as f:
    page = f.read()
  assert f'href="{repo}/blob/{ref}/results/long_context/results.md"' in page
  assert f'src="{repo}/raw/{ref}/results/long_context/speedup_surface.png"' in page
  assert 'href="../results/' not in page and 'src="../results/' not in page
  with open(site / "index.html", encoding="utf-8") as f:
    assert f'href="{repo}/tree/{ref}/results"' in f.read()   # a folder


def test_broken_internal_links_fail_the_build(tmp_path):
  # The negative control: mkdocs.yml as it is, over three pages with a link to a missing page,
  # a link to a missing heading and a page the nav leaves out. Each is named, nothing else warns.
  docs = tmp_path / "docs"
  docs.mkdir()
  (docs / "index.md").write_text("# Home\n\n[fine](other.md#a-heading) [gone](no-such-page.md) "
                                 "[no heading](other.md#no-such-heading)\n")
  (docs / "other.md").write_text("# Other\n\n## A heading\n\n[home](index.md)\n")
  (docs / "orphan.md").write_text("# Orphan\n")
  import yaml
  config = yaml.safe_dump({**_config(), "docs_dir": str(docs), "nav": ["index.md", "other.md"]},
                          allow_unicode=True)
  res = _mkdocs_build(tmp_path / "site", config)
  assert res.returncode != 0
  warnings = [line for line in res.stderr.splitlines() if line.startswith("WARNING")]
  assert len(warnings) == 3, res.stderr
  assert any("'no-such-page.md'" in w for w in warnings), warnings
  assert any("'#no-such-heading'" in w for w in warnings), warnings
  assert "not included in the \"nav\"" in res.stderr and "- orphan.md" in res.stderr, res.stderr
  # The same pages without the three faults build.
  (docs / "index.md").write_text("# Home\n\n[fine](other.md#a-heading)\n")
  (docs / "orphan.md").unlink()
  res = _mkdocs_build(tmp_path / "site", config)
  assert res.returncode == 0, res.stderr[-3000:]


# -----------------------------------------------------------------------------
# docs/hooks/repo_links.py
# -----------------------------------------------------------------------------


def _rewrite(markdown, src="where-it-pays.md"):
  hook = _load("repo_links")
  config = types.SimpleNamespace(
      repo_url="https://github.com/o/r", extra={"source_ref": "main"},
      docs_dir=os.path.join(ROOT, "docs"), config_file_path=os.path.join(ROOT, "mkdocs.yml"))
  page = types.SimpleNamespace(file=types.SimpleNamespace(src_path=src, src_uri=src))
  return hook.on_page_markdown(markdown, page, config, None)


def test_repo_links_rewrites_links_out_of_docs_and_keeps_the_rest():
  md = textwrap.dedent("""\
      [page](library.md#the-two-decoders) [api](api/index.md)
      [folder](../results/) [file](../pyproject.toml#L1)
      ![plot](../results/long_context/speedup_surface.png)
      ```
      [in a fence](../pyproject.toml)
      ```
      """)
  out = _rewrite(md).splitlines()
  assert out[0] == "[page](library.md#the-two-decoders) [api](api/index.md)"
  assert out[1] == ("[folder](https://github.com/o/r/tree/main/results) "
                    "[file](https://github.com/o/r/blob/main/pyproject.toml#L1)")
  assert out[2] == "![plot](https://github.com/o/r/raw/main/results/long_context/" \
                   "speedup_surface.png)"
  assert out[4] == "[in a fence](../pyproject.toml)"
  # From a page in a subfolder, one more level up.
  assert _rewrite("[s](../../specjax/api.py)", "api/specjax.md") == \
      "[s](https://github.com/o/r/blob/main/specjax/api.py)"


def test_repo_links_warns_for_a_file_the_repository_does_not_have(caplog):
  with caplog.at_level(logging.WARNING):
    out = _rewrite("[gone](../results/no_such_run/README.md) [up](../../../etc/passwd)")
  assert out == "[gone](../results/no_such_run/README.md) [up](../../../etc/passwd)"
  messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(messages) == 2, messages
  assert "results/no_such_run/README.md" in messages[0] and "outside the repository" in messages[1]


# -----------------------------------------------------------------------------
# docs/hooks/griffe_conventions.py
# -----------------------------------------------------------------------------


def test_grouped_args_names_are_each_checked_against_the_signature(tmp_path, caplog):
  import griffe
  conventions = _load("griffe_conventions")
  (tmp_path / "fakepkg").mkdir()
  (tmp_path / "fakepkg" / "__init__.py").write_text(textwrap.dedent('''\
      def f(target, target_params, *, steps, repeats, **kwargs):
        """Doc.

        Args:
          target, target_params: both in the signature.
          steps, stale: one of two is not.
          repeats: alone.
          kwargs: starred.
        """


      class K:
        """K.

        Args:
          x, y: y is not a parameter of __init__.
        """

        def __init__(self, x):
          pass
      '''))
  with caplog.at_level(logging.WARNING, logger="griffe"):
    griffe.load("fakepkg", search_paths=[str(tmp_path)],
                extensions=griffe.load_extensions(conventions.GroupedParams))
  messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(messages) == 2, messages
  assert "fakepkg.f" in messages[0] and "'stale'" in messages[0]
  assert "fakepkg.K" in messages[1] and "'y'" in messages[1]


def test_two_space_blocks_of_prose_are_fenced_and_sections_and_lists_are_not():
  conventions = _load("griffe_conventions")
  doc = textwrap.dedent("""\
      Summary.

        out = speculative_generate(target, tp, draft, dp,
                                   prompts, lengths)

      * a list item
        continued

        1. a numbered item

      Args:
        x: a parameter
          continued.

        y: another.
      Text again.""")
  fenced = conventions.fence_indented_blocks(doc)
  assert fenced.splitlines() == [
      "Summary.", "",
      "```", "out = speculative_generate(target, tp, draft, dp,",
      "                           prompts, lengths)", "```", "",
      "* a list item", "  continued", "", "  1. a numbered item", "",
      "Args:", "  x: a parameter", "    continued.", "", "  y: another.", "Text again."]
  # A fence (its own, or one made here) is kept as it is: fencing twice changes nothing.
  assert conventions.fence_indented_blocks(fenced) == fenced
  own = "Text.\n\n```\ndef f():\n\n  return 1\n```"
  assert conventions.fence_indented_blocks(own) == own
