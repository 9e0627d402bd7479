"""Test helpers for the data builders: a fake apt lists directory."""

import os
import shutil

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "data")


def lists_dir(tmp_path) -> str:
  """`tmp_path/lists` holding one Translation-en index (the fixture), named as apt names it."""
  lists = tmp_path / "lists"
  lists.mkdir()
  shutil.copy(os.path.join(FIXTURES, "Translation-en"),
              lists / "example_dists_main_i18n_Translation-en")
  return str(lists)
