"""The seeds' exercise on fixture plays: the corpus builder (local texts, a
Gutenberg header stripped, split by play, reused) and the micro preset end to
end (joint heads, pruned draft, the results table)."""

import json
import os

import numpy as np
import pytest

from configs import shakespeare_heads as shk_config
from experiments.data.shakespeare import CharVocab, build_shakespeare, load_shakespeare
from experiments.programs import shakespeare_heads


WORDS = "thou art my lord and shall not the king hath come to thee good night sweet prince".split()


@pytest.fixture(scope="module")
def plays(tmp_path_factory):
  root = tmp_path_factory.mktemp("plays")
  rng = np.random.default_rng(0)
  for i in range(6):
    body = "\n".join("KING. " + " ".join(rng.choice(WORDS, 8)) + "." for _ in range(200))
    text = ("The Project Gutenberg header\n*** START OF THE PROJECT GUTENBERG EBOOK ***\n"
            + body + "\n*** END OF THE PROJECT GUTENBERG EBOOK ***\nlicense text")
    (root / f"play{i}_gut.txt").write_text(text)
  return root


def test_corpus_is_built_split_by_play_and_reused(plays, tmp_path):
  out = build_shakespeare(str(tmp_path), f"dir:{plays}")
  meta = json.loads(open(os.path.join(out, "meta.json")).read())
  assert sorted(sum(meta["plays"].values(), [])) == [f"play{i}_gut" for i in range(6)]
  assert len(meta["plays"]["validation"]) == len(meta["plays"]["test"]) == 2
  texts, vocab = load_shakespeare(str(tmp_path))
  assert "Gutenberg" not in texts["train"] and "license" not in texts["train"]
  assert texts["train"].startswith("KING.")
  assert vocab.decode(vocab.encode("thou art")) == "thou art"
  assert CharVocab("ab").encode("abz") == [1, 2, 0]
  mtime = os.path.getmtime(os.path.join(out, "train.txt"))
  assert build_shakespeare(str(tmp_path), f"dir:{plays}") == out
  assert os.path.getmtime(os.path.join(out, "train.txt")) == mtime  # reused
  with pytest.raises(FileNotFoundError, match="does not exist"):
    build_shakespeare(str(tmp_path / "other"), "dir:/no/such/plays")


def test_micro_preset_end_to_end(plays, tmp_path):
  cfg = shk_config.get_config("micro")
  cfg.workdir = str(tmp_path / "run")
  cfg.data.cache_dir = str(tmp_path / "data")
  cfg.data.source = f"dir:{plays}"
  res = shakespeare_heads.run(cfg)
  systems = {r["system"] for r in res["rows"]}
  assert "autoregressive" in systems and "heads, chain (3)" in systems
  assert any(s.startswith("heads, tree") for s in systems)
  assert any(s.startswith("pruned draft") for s in systems)
  for r in res["rows"]:
    assert r["tokens_per_call"] >= 1.0 and r["ms_per_token"] > 0
  acc = np.asarray(res["heads_topk_accuracy"])
  assert acc.shape == (3, 10) and acc.sum(1).max() <= 1.0 + 1e-6
  assert set(res["lm_ce"]) == {"joint", "lm_only", "pruned_draft", "pruned_undistilled"}
  md = open(os.path.join(res["_out_dir"], "results.md")).read()
  assert "## What it shows" in md and "pruned draft" in md
  again = shakespeare_heads.run(cfg)  # a rerun reuses every stage
  assert again["rows"] == res["rows"]
