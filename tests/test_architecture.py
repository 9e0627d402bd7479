"""The architecture contract (docs/architecture.md): every package imports only
the layers below it (`.importlinter`, checked by import-linter), and only the
programs (`experiments/`, outside the package) import the package root with its public API;
the library never imports the programs."""

import ast
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, ".importlinter")


def _lint(package_parent: str, config: str = CONFIG) -> subprocess.CompletedProcess:
  """`lint-imports` on the `specjax` and `experiments` packages under `package_parent`."""
  env = dict(os.environ, PYTHONPATH=package_parent)
  code = ("import sys; from importlinter.cli import lint_imports; "
          f"sys.exit(lint_imports(config_filename={config!r}))")
  return subprocess.run([sys.executable, "-c", code], cwd=package_parent, env=env,
                        capture_output=True, text=True, timeout=300)


def test_every_package_imports_only_downward():
  res = _lint(ROOT)
  assert res.returncode == 0, res.stdout + res.stderr
  assert "specjax imports only downward KEPT" in res.stdout
  assert "the library never imports the programs KEPT" in res.stdout


def _copy(tmp_path):
  for name in ("specjax", "experiments"):
    shutil.copytree(os.path.join(ROOT, name), tmp_path / name,
                    ignore=shutil.ignore_patterns("__pycache__"))


def test_the_contract_catches_an_upward_import(tmp_path):
  # Negative control: a copy of the packages in which a model imports the API.
  _copy(tmp_path)
  layers = tmp_path / "specjax" / "models" / "layers.py"
  layers.write_text(layers.read_text() + "\nfrom specjax import api  # noqa: E402,F401\n")
  res = _lint(str(tmp_path))
  assert res.returncode != 0
  assert "specjax.models is not allowed to import specjax.api" in res.stdout


def test_the_contract_catches_the_library_importing_a_program(tmp_path):
  # Negative control: the API imports a paper program.
  _copy(tmp_path)
  api = tmp_path / "specjax" / "api.py"
  api.write_text(api.read_text() + "\nfrom experiments.programs import leviathan  # noqa\n")
  res = _lint(str(tmp_path))
  assert res.returncode != 0
  assert "the library never imports the programs BROKEN" in res.stdout


def _imports_of_the_root(path: str):
  """Line numbers where `path` imports the package root `specjax` itself
  (`import specjax`, or a public name through `from specjax import ...`)."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  package = os.path.join(ROOT, "specjax")
  for node in ast.walk(tree):
    if isinstance(node, ast.Import) and any(a.name == "specjax" for a in node.names):
      yield node.lineno
    elif isinstance(node, ast.ImportFrom) and node.module == "specjax":
      for a in node.names:  # submodules are fine: `from specjax import theory`
        if not (os.path.exists(os.path.join(package, a.name + ".py"))
                or os.path.isdir(os.path.join(package, a.name))):
          yield node.lineno


def test_only_the_programs_import_the_package_root():
  offenders = []
  for folder, _, files in os.walk(os.path.join(ROOT, "specjax")):
    rel = os.path.relpath(folder, ROOT).replace(os.sep, ".")
    for name in files:
      if name.endswith(".py") and not (rel == "specjax" and name == "__init__.py"):
        path = os.path.join(folder, name)
        offenders += [f"{os.path.relpath(path, ROOT)}:{line}"
                      for line in _imports_of_the_root(path)]
  assert offenders == []


# Every name `specjax/__init__.py` exported before the redesign (stop 46).
_PUBLIC = ["generate", "speculative_generate", "prefill", "Prefill", "required_cache_len",
           "GenerationOutput", "DecodeStats", "DecodeState", "AutoregressiveDecoder",
           "SpeculativeDecoder", "SamplingConfig", "GREEDY", "process_logits",
           "rejection_verify", "measure_beta", "LanguageModel", "DecoderLM", "DecoderConfig",
           "decoder_config", "DECODER_CONFIGS", "T5", "T5Config", "t5_config", "T5_CONFIGS",
           "UnigramLM", "BigramLM", "theory", "tune_matvec_rows", "MatvecChoice",
           "import_hf_decoder", "export_hf_decoder", "import_hf_t5", "export_hf_t5",
           "HFTokenizer", "SentencePieceTokenizer", "load_tokenizer",
           "check_tokenizers_compatible"]


def test_the_public_api_is_unchanged():
  import specjax  # pylint: disable=g-import-not-at-top
  assert sorted(set(_PUBLIC) - set(specjax.__all__)) == []
  assert [name for name in _PUBLIC if not hasattr(specjax, name)] == []


def test_the_renamed_importers_warn_and_forward(tmp_path):
  from specjax.checkpoints import hf_llama  # pylint: disable=g-import-not-at-top
  for old in (hf_llama.import_hf_llama, lambda p: hf_llama.export_hf_llama({}, None, p)):
    with pytest.warns(DeprecationWarning, match="_hf_decoder"):
      with pytest.raises((FileNotFoundError, ValueError, TypeError, AttributeError)):
        old(str(tmp_path / "missing"))
