"""mkdocs hook: links from the pages to the rest of the repository.

The pages link to results, benchmarks, notebooks and source files with relative links
(`../results/long_context/results.md`), which work on GitHub and in a checkout. In the built
site such a link points outside the site, so this hook rewrites it, before mkdocs reads the
page, to the file on GitHub: `<repo_url>/blob/<extra.source_ref>/<path>` (`tree/` for a folder,
`raw/` for an image). A link to a file the checkout does not have warns, which
`mkdocs build --strict` makes an error, as mkdocs does for a broken link between pages.
"""

import os
import posixpath
import re

from mkdocs.plugins import get_plugin_logger

log = get_plugin_logger(__name__)

_LINK = re.compile(r"\]\((\.\./[^)\s#]*)(#[^)\s]*)?\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_IMAGES = (".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp")


def _base(config) -> str:
  repo_url, ref = config.repo_url, config.extra.get("source_ref")
  if not repo_url or not ref:
    raise ValueError("mkdocs.yml needs repo_url and extra.source_ref for docs/hooks/repo_links.py")
  return repo_url.rstrip("/")


def on_page_markdown(markdown, page, config, files):
  base, ref = _base(config), config.extra["source_ref"]
  docs_dir = os.path.abspath(config.docs_dir)
  root = os.path.dirname(os.path.abspath(config.config_file_path))
  page_dir = os.path.dirname(os.path.join(docs_dir, page.file.src_path))

  def rewrite(match):
    link, fragment = match.group(1), match.group(2) or ""
    target = os.path.normpath(os.path.join(page_dir, link))
    if target == docs_dir or target.startswith(docs_dir + os.sep):
      return match.group(0)   # a page or a file of the site: mkdocs checks it
    rel = os.path.relpath(target, root)
    if rel.startswith(".."):
      log.warning(f"Doc file '{page.file.src_uri}' links to '{link}', outside the repository")
      return match.group(0)
    if not os.path.exists(target):
      log.warning(f"Doc file '{page.file.src_uri}' links to '{link}', but the repository has no "
                  f"'{rel}'")
      return match.group(0)
    kind = "tree" if os.path.isdir(target) else "raw" if rel.lower().endswith(_IMAGES) else "blob"
    url = f"{base}/{kind}/{ref}/{posixpath.join(*rel.split(os.sep))}"
    return f"]({url}{fragment})"

  out, fenced = [], False
  for line in markdown.split("\n"):
    if _FENCE.match(line):
      fenced = not fenced
    out.append(line if fenced else _LINK.sub(rewrite, line))
  return "\n".join(out)
