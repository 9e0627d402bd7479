"""Entry points: --help exits 0 (specjax._app) and specjax-aot on named shapes."""

import pytest

from specjax import _app
from specjax.aot.from_config import run_from_names
from specjax.models.decoder import DecoderLM
from specjax.models.t5 import T5


@pytest.mark.parametrize("argv,asks", [
    (["prog", "--help"], True), (["prog", "-h"], True), (["prog", "--helpfull"], True),
    (["prog", "--x=1", "--helpshort"], True), (["prog", "--config=a.py"], False),
    (["prog", "--", "--help"], False), (["--help"], False)])
def test_asks_for_help(argv, asks):
  assert _app.asks_for_help(argv) is asks


def test_run_app_exits_0_after_help_and_keeps_other_exits():
  ran = []
  with pytest.raises(SystemExit) as e:
    _app.run_app(ran.append, ["prog", "--help"])
  assert e.value.code == 0 and not ran
  with pytest.raises(SystemExit) as e:   # an unknown flag: absl's usage error, exit 1 kept
    _app.run_app(ran.append, ["prog", "--no_such_flag_here=1"])
  assert e.value.code == 1 and not ran


def test_aot_run_from_named_shapes():
  run = run_from_names("llama-3.1-8b", ("llama-3.2-1b",), "v5e:2x4", gammas=(3, 5),
                       batch_size=2, prompt_len=128, max_new_tokens=16)
  assert isinstance(run.target, DecoderLM) and run.target.config.dtype == "bfloat16"
  assert run.target.config.num_layers == 32 and [n for n, _ in run.drafts] == ["llama-3.2-1b"]
  assert (run.topology, run.gammas, run.batch_size) == ("v5e:2x4", (3, 5), 2)
  t5 = run_from_names("t5-v1_1-xxl", ("t5-v1_1-small",), "v4:2x2x1", dtype="float32")
  assert isinstance(t5.target, T5) and t5.target.config.dtype == "float32"
  with pytest.raises(ValueError, match="draft 't5-small' is not of the target"):
    run_from_names("llama-3.1-8b", ("t5-small",), "v5e:2x4")
  with pytest.raises(ValueError, match="no topology"):
    run_from_names("llama-3.1-8b")
