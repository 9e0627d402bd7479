"""The plots under results/ are where people look: every PNG is embedded by a README, with alt
text that says what it shows, or listed here as not worth showing; every image a README
embeds exists."""

import glob
import os
import re
import sys

import pytest

from bench_helpers import ROOT

# PNG (relative to the repository root) -> why no README shows it.
NOT_SHOWN = {
    "results/leviathan_t5/quick/alpha.png":
        "the quick preset's smoke run (micro models); the full run's plot is in the README",
    "results/leviathan_t5/quick/auto_gamma.png":
        "the quick preset's smoke run (micro models); the full run's plot is in the README",
    "results/leviathan_t5/quick/speedup_vs_gamma.png":
        "the quick preset's smoke run (micro models); the full run's plot is in the README",
}
_IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_MIN_ALT_WORDS = 5


def embedded_images(readmes):
  """{image path relative to the repository root: [(README, alt text), ...]} for the markdown
  images (`![alt](src)`) of `readmes` (paths relative to the root); remote images skipped."""
  out = {}
  for readme in readmes:
    with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
      text = f.read()
    for m in _IMAGE.finditer(text):
      src = m.group("src")
      if "://" in src:
        continue
      path = os.path.normpath(os.path.join(os.path.dirname(readme), src.split("#")[0]))
      out.setdefault(path, []).append((readme, m.group("alt").strip()))
  return out


def picture_problems(pngs, readmes, not_shown):
  """Sentences for each PNG of `pngs` no README of `readmes` embeds (and `not_shown` does not
  list), each embed whose alt text says too little, and each embedded image that is missing."""
  images = embedded_images(readmes)
  problems = [f"{p} is embedded by no README and not listed as not worth showing"
              for p in pngs if p not in images and p not in not_shown]
  problems += [f"{readme} embeds {p} with alt text {alt!r}: say what it shows"
               for p, uses in images.items() for readme, alt in uses
               if len(alt.split()) < _MIN_ALT_WORDS]
  problems += [f"{readme} embeds {p}, which does not exist"
               for p, uses in images.items() for readme, _ in uses
               if not os.path.exists(os.path.join(ROOT, p))]
  problems += [f"{p} is listed as not shown but a README embeds it" for p in not_shown
               if p in images]
  return problems


def _rel(paths):
  return sorted(os.path.relpath(p, ROOT) for p in paths)


def _pngs():
  return _rel(glob.glob(os.path.join(ROOT, "results", "**", "*.png"), recursive=True))


def _readmes():
  found = glob.glob(os.path.join(ROOT, "results", "**", "README.md"), recursive=True)
  return _rel(found + [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "benchmarks",
                                                                      "README.md")])


def test_there_are_plots_to_check():
  assert len(_pngs()) >= 20 and len(_readmes()) >= 10


def test_every_plot_under_results_is_shown_by_a_readme():
  assert picture_problems(_pngs(), _readmes(), NOT_SHOWN) == []


def test_the_not_shown_list_names_plots_that_exist():
  assert all(os.path.exists(os.path.join(ROOT, p)) for p in NOT_SHOWN)


@pytest.mark.parametrize("readme", [r for r in _readmes() if r.startswith("results/")])
def test_a_results_readme_shows_the_plots_of_its_own_folder(readme):
  folder = os.path.dirname(readme)
  own = [p for p in _pngs() if os.path.dirname(p) == folder and p not in NOT_SHOWN]
  shown = {p for p, uses in embedded_images([readme]).items()}
  assert set(own) <= shown, sorted(set(own) - shown)


def test_the_readme_shows_where_speculation_pays():
  images = embedded_images(["README.md"])
  assert "results/long_context/speedup_surface.png" in images


def test_the_checker_catches_a_plot_nobody_shows(tmp_path, monkeypatch):
  # Negative controls, in a scratch tree: an unembedded PNG, a terse alt, a missing image.
  monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
  (tmp_path / "results" / "r").mkdir(parents=True)
  for name in ("a.png", "b.png", "c.png"):
    (tmp_path / "results" / "r" / name).write_bytes(b"\x89PNG")
  (tmp_path / "results" / "r" / "README.md").write_text(
      "![Speedup against batch size for three drafts](a.png)\n![plot](b.png)\n"
      "![The acceptance rate by position, greedy](gone.png)\n", encoding="utf-8")
  pngs = ["results/r/a.png", "results/r/b.png", "results/r/c.png"]
  problems = picture_problems(pngs, ["results/r/README.md"], {})
  assert any("c.png is embedded by no README" in p for p in problems)
  assert any("b.png with alt text 'plot'" in p for p in problems)
  assert any("gone.png, which does not exist" in p for p in problems)
  assert not any("a.png" in p for p in problems)
  listed = picture_problems(pngs, ["results/r/README.md"], {"results/r/c.png": "not worth it"})
  assert not any("c.png" in p for p in listed) and len(listed) == len(problems) - 1
