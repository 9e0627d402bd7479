"""Compile-only runs for TPU topologies (libtpu's compiler, no TPU attached)."""

import dataclasses
import json
from unittest import mock

import numpy as np
import pytest
from jax.sharding import Mesh

from specjax.aot import chips, hlo_cost
from specjax.aot.programs import lower_ar_loop
from specjax.aot.report import compile_program
from specjax.aot.run import AotRun, merge_results, replan, run_aot
from specjax.models.decoder import DecoderConfig, DecoderLM, decoder_config
from specjax.models.t5 import T5, t5_config
from specjax.parallel.sharding import DATA, MODEL
from specjax.planning.memory import memory_plan
from specjax.planning.mesh import choose_mesh


# A hand-written module: every accounting rule of `hlo_cost`, with known answers.
_HLO = """HloModule m

%fused_dus (param_0.1: f32[4,1024], param_1.1: f32[4,1], param_2.1: s32[]) -> f32[4,1024] {
  %param_0.1 = f32[4,1024]{1,0} parameter(0)
  %param_1.1 = f32[4,1]{1,0} parameter(1)
  %param_2.1 = s32[] parameter(2)
  %c0 = s32[] constant(0)
  ROOT %dus.1 = f32[4,1024]{1,0} dynamic-update-slice(%param_0.1, %param_1.1, %c0, %param_2.1)
}

%fused_slice (param_0.2: f32[1000,256], param_1.2: s32[]) -> f32[1,256] {
  %param_0.2 = f32[1000,256]{1,0} parameter(0)
  %param_1.2 = s32[] parameter(1)
  %c1 = s32[] constant(0)
  ROOT %ds.1 = f32[1,256]{1,0} dynamic-slice(%param_0.2, %param_1.2, %c1), dynamic_slice_sizes={1,256}
}

%inner_body (p.3: (s32[], f32[512])) -> (s32[], f32[512]) {
  %p.3 = (s32[], f32[512]{0}) parameter(0)
  %i.3 = s32[] get-tuple-element(%p.3), index=0
  %x.3 = f32[512]{0} get-tuple-element(%p.3), index=1
  %neg.3 = f32[512]{0} negate(%x.3)
  ROOT %t.3 = (s32[], f32[512]{0}) tuple(%i.3, %neg.3)
}

%inner_cond (p.4: (s32[], f32[512])) -> pred[] {
  %p.4 = (s32[], f32[512]{0}) parameter(0)
  %i.4 = s32[] get-tuple-element(%p.4), index=0
  %n.4 = s32[] constant(3)
  ROOT %lt.4 = pred[] compare(%i.4, %n.4), direction=LT
}

%body (p.5: (s32[], f32[4,1024], f32[1000,256], f32[512])) -> (s32[], f32[4,1024], f32[1000,256], f32[512]) {
  %p.5 = (s32[], f32[4,1024]{1,0}, f32[1000,256]{1,0}, f32[512]{0}) parameter(0)
  %i.5 = s32[] get-tuple-element(%p.5), index=0
  %cache.5 = f32[4,1024]{1,0} get-tuple-element(%p.5), index=1
  %table.5 = f32[1000,256]{1,0} get-tuple-element(%p.5), index=2
  %v.5 = f32[512]{0} get-tuple-element(%p.5), index=3
  %row.5 = f32[1,256]{1,0} fusion(%table.5, %i.5), kind=kLoop, calls=%fused_slice
  %upd.5 = f32[4,1]{1,0} slice(%cache.5), slice={[0:4], [0:1]}
  %new.5 = f32[4,1024]{1,0} fusion(%cache.5, %upd.5, %i.5), kind=kLoop, calls=%fused_dus
  %ar.5 = f32[1,256]{1,0} all-reduce(%row.5), replica_groups={}, to_apply=%add
  %vm.5 = f32[512]{0:S(1)} copy(%v.5)
  %cs.5 = (f32[4,1024]{1,0}, f32[4,1024]{1,0}, u32[]) copy-start(%new.5)
  %cd.5 = f32[4,1024]{1,0} copy-done(%cs.5)
  %init.5 = (s32[], f32[512]{0}) tuple(%i.5, %v.5)
  %w.5 = (s32[], f32[512]{0}) while(%init.5), condition=%inner_cond, body=%inner_body
  %one = s32[] constant(1)
  %next = s32[] add(%i.5, %one)
  ROOT %t.5 = (s32[], f32[4,1024]{1,0}, f32[1000,256]{1,0}, f32[512]{0}) tuple(%next, %cd.5, %table.5, %v.5)
}

%cond (p.6: (s32[], f32[4,1024], f32[1000,256], f32[512])) -> pred[] {
  %p.6 = (s32[], f32[4,1024]{1,0}, f32[1000,256]{1,0}, f32[512]{0}) parameter(0)
  %i.6 = s32[] get-tuple-element(%p.6), index=0
  %lim = s32[] constant(100)
  %lt.6 = pred[] compare(%i.6, %lim), direction=LT
  ROOT %and.6 = pred[] and(%lt.6, %lt.6)
}

ENTRY %main (a: (s32[], f32[4,1024], f32[1000,256], f32[512])) -> (s32[], f32[4,1024], f32[1000,256], f32[512]) {
  %a = (s32[], f32[4,1024]{1,0}, f32[1000,256]{1,0}, f32[512]{0}) parameter(0)
  ROOT %w = (s32[], f32[4,1024]{1,0}, f32[1000,256]{1,0}, f32[512]{0}) while(%a), condition=%cond, body=%body
}
"""


def test_hlo_accounting_rules_on_a_known_module():
  cost = hlo_cost.loop_cost(_HLO, copy_threshold=16 * 1024)
  assert cost.body == "body" and cost.trip_count is None
  # Reads: the table only sliced (one 256-float row, not 1000 rows) plus the s32 index;
  # `slice` reads the [4, 1] slice (16 B), not the cache; the in-place update reads the
  # update and the index, the cache itself not at all; the all-reduce reads its row; the
  # copy of `v` reads 512 floats and writes to on-chip memory (S(1): no HBM write); the
  # copy-start moves the 16 KiB cache HBM -> HBM; the inner loop runs 3 times (its
  # condition counts to 3): a negate of 512 floats and a compare of two s32 each; the
  # add reads two s32; the condition: a compare (two s32) and an `and` (two preds).
  row, upd, vec, cache, s32 = 256 * 4, 4 * 4, 512 * 4, 4 * 1024 * 4, 4
  assert cost.bytes_read == ((row + s32) + upd + (upd + s32) + row + vec + cache
                             + 3 * (vec + 2 * s32) + 2 * s32 + (2 * s32 + 2))
  assert cost.bytes_written == (row + upd + upd + row + 0 + cache + 3 * (vec + 1) + s32
                                + (1 + 1))
  assert cost.collectives == {"all-reduce": (1, row)}
  assert cost.hbm_copies == [("cs.5", cache, True)]
  assert cost.host_transfers == 0 and cost.unknown_trips == 0
  with pytest.raises(ValueError, match="no ENTRY"):
    hlo_cost.loop_cost("not hlo")


def test_shape_bytes():
  assert hlo_cost.shape_bytes("bf16[8,4096]{1,0:T(8,128)(2,1)}") == 8 * 4096 * 2
  assert hlo_cost.shape_bytes("(f32[2], s32[3], pred[])") == 8 + 12 + 1
  assert hlo_cost.shape_bytes("f32[64]{0:S(1)}", hbm_only=True) == 0


def test_topologies_and_chips():
  assert chips.parse_topology("v5e:2x4") == ("v5e", (2, 4))
  assert chips.parse_topology("v4:2x2x4") == ("v4", (2, 2, 4))
  for bad in ("v5e", "v9:2x2", "v5e:2", "v5e:0x2"):
    with pytest.raises(ValueError, match="topology"):
      chips.parse_topology(bad)
  with pytest.raises(TypeError, match="topology must be a string"):
    chips.parse_topology(8)
  with pytest.raises(ValueError, match="chip must be one of"):
    chips.chip("v3")
  devices = chips.topology_devices("v5e:2x2")
  assert len(devices) == 4 and chips.chip_of_device(devices[0]).name == "v5e"
  v4 = chips.topology_devices("v4:2x2x1")      # one device per chip (megacore)
  assert len(v4) == 4 and chips.chip_of_device(v4[0]).hbm_bytes == 32 << 30
  assert len(chips.topology_devices("v4:1x1x1")) == 1
  assert chips.num_hosts(chips.topology_devices("v5e:4x4")) == 2


# Tile-friendly tiny shapes (TPU tiles are 8 x 128): the compiler's figures are then
# the arrays' own bytes, comparable with the memory plan.
_DEC = DecoderConfig(vocab_size=1024, d_model=256, num_layers=2, num_heads=4, num_kv_heads=4,
                     head_dim=128, mlp_dim=512, dtype="bfloat16", param_dtype="bfloat16")
_DRAFT = DecoderConfig(vocab_size=1024, d_model=128, num_layers=1, num_heads=2, num_kv_heads=2,
                       head_dim=128, mlp_dim=256, dtype="bfloat16", param_dtype="bfloat16",
                       tie_embeddings=True)


@pytest.fixture(scope="module")
def tiny_decoder_report():
  run = AotRun("v5e:2x2", DecoderLM(_DEC), (("draft", DecoderLM(_DRAFT)),), gammas=(3,),
               batch_size=8, prompt_len=120, max_new_tokens=8, cache_len=256,
               programs=("ar", "draft", "prompt_lookup"), alphas=(("draft", 0.8),))
  return run_aot(run, progress=lambda m: None)


def test_tiny_decoder_compiles_for_v5e_and_fits(tiny_decoder_report):
  r = tiny_decoder_report
  assert r["devices"] == 4 and r["mesh"] == [1, 4] and r["chip"]["name"] == "v5e"
  by = {p["name"]: p for p in r["programs"]}
  assert set(by) == {"ar", "speculative draft draft γ=3", "speculative prompt lookup γ=3"}
  for p in by.values():
    assert p["error"] is None and p["fits"], p["name"]
    loop = p["loop"]
    assert loop["host_transfers"] == 0, p["name"]          # the loop stays on the device
    assert loop["hbm_copies"] == [], p["name"]             # no cache-sized copy per iteration
    # Collectives at the Megatron minimum: 2 all-reduces per target layer and 1 for the
    # vocab-parallel embedding; the vocab-split logits gathered once (`whole_vocab`), not
    # one collective per reduction of the sampler. The replicated draft adds none.
    assert loop["collectives"] == {
        "all-reduce": {"count": 2 * _DEC.num_layers + 1, "bytes": mock.ANY},
        "all-gather": {"count": 1, "bytes": mock.ANY}}, (p["name"], loop["collectives"])
    assert p["predicted_s"]["total_s"] > 0
  # The donated cache is updated in place: the aliased bytes cover it.
  assert by["ar"]["alias_bytes"] >= 0.99 * by["ar"]["slices"]["target_cache"]
  # The memory plan agrees with the compiler's arguments within 10% per device.
  for p in by.values():
    if p["plan"] is not None:
      assert 0.9 <= p["plan"]["ratio"] <= 1.1, (p["name"], p["plan"])
  speed = {s["program"]: s for s in r["speedups"]}
  assert speed["speculative draft draft γ=3"]["alpha"] == 0.8
  assert "| ar |" in r["markdown"]


def test_programs_compiled_apart_merge_into_the_same_result(tiny_decoder_report):
  # What benchmarks/tpu_aot.py does for the 70B cases: each program kind compiled in its own
  # process, the parts merged. The merge must give what compiling them together gave.
  r = tiny_decoder_report
  run = AotRun("v5e:2x2", DecoderLM(_DEC), (("draft", DecoderLM(_DRAFT)),), gammas=(3,),
               batch_size=8, prompt_len=120, max_new_tokens=8, cache_len=256,
               programs=("ar", "draft", "prompt_lookup"), alphas=(("draft", 0.8),))
  assert AotRun("v5e:2x2", DecoderLM(_DEC), programs=("draft", "ar")).kinds == ("ar", "draft")
  parts = [dict(r, programs=[p]) for p in r["programs"]]
  for part in parts:   # a part alone has no AR step to compare against
    part["speedups"] = []
  merged = merge_results(json.loads(json.dumps(parts)), run)
  assert [p["name"] for p in merged["programs"]] == [p["name"] for p in r["programs"]]
  assert merged["programs"] == json.loads(json.dumps(r["programs"]))
  assert merged["speedups"] == r["speedups"] and merged["speedups"]
  assert merged["fits"] is True and merged["markdown"] == r["markdown"]
  with pytest.raises(ValueError, match="differ in \\['batch_size'\\]"):
    merge_results([parts[0], dict(parts[1], batch_size=4)], run)
  with pytest.raises(ValueError, match="at least one"):
    merge_results([], run)
  with pytest.raises(ValueError, match="needs \\['argument_bytes'\\]"):
    merge_results([dict(parts[0], programs=[{k: v for k, v in r["programs"][0].items()
                                              if k != "argument_bytes"}])], run)


def test_the_cli_compiles_program_kinds_apart(tiny_decoder_report, monkeypatch, tmp_path):
  # `python -m specjax.aot --separate_processes`: one child per kind, each given the parent's
  # flags but --programs / --out, writing its result where --part_out says; merged after.
  from specjax.aot import __main__ as cli
  argv = ["--config=c.py:quick", "--topology", "v5e:2x2", "--programs", "ar,draft",
          "--separate_processes", "--out=/x", "--param_layouts=auto"]
  assert cli._child_args(argv) == ["--config=c.py:quick", "--topology", "v5e:2x2",
                                   "--param_layouts=auto"]
  r = tiny_decoder_report
  by_kind = {"ar": [r["programs"][0]], "draft": [r["programs"][1]]}
  calls = []

  def fake_call(cmd):
    calls.append(cmd)
    kind = next(a for a in cmd if a.startswith("--programs=")).split("=")[1]
    out = next(a for a in cmd if a.startswith("--part_out=")).split("=", 1)[1]
    with open(out, "w", encoding="utf-8") as f:
      json.dump(dict(r, programs=by_kind[kind], speedups=[]), f)
    return 0
  monkeypatch.setattr(cli.subprocess, "call", fake_call)
  monkeypatch.setattr(cli.sys, "argv", ["specjax-aot"] + argv)
  run = AotRun("v5e:2x2", DecoderLM(_DEC), (("draft", DecoderLM(_DRAFT)),), gammas=(3,),
               batch_size=8, prompt_len=120, max_new_tokens=8, cache_len=256,
               programs=("ar", "draft"), alphas=(("draft", 0.8),))
  merged = cli._compile_apart(run, ["ar", "draft"])
  assert [c[-2:] for c in calls] == [["--programs=ar", calls[0][-1]],
                                     ["--programs=draft", calls[1][-1]]]
  assert all("--out=/x" not in c and "--param_layouts=auto" in c for c in calls)
  assert [p["name"] for p in merged["programs"]] == ["ar", "speculative draft draft γ=3"]
  assert merged["speedups"][0]["alpha"] == 0.8     # computed across the parts
  monkeypatch.setattr(cli.subprocess, "call", lambda cmd: -9)
  with pytest.raises(RuntimeError, match="'ar' programs failed \\(exit -9"):
    cli._compile_apart(run, ["ar", "draft"])


def test_weights_in_the_compilers_layouts_need_no_copies():
  # Per device the target's q / k / v kernels are [8192, 4, 128]; the speculative loop wants
  # them in another layout than the device default, so the compiler copies them once per
  # program into temporaries (2.4 GB per chip for chinchilla-70b on 16 v4 chips,
  # results/tpu_aot). With the weights in the layouts it chooses (what a deployment placing
  # them in the program's `input_formats` runs) the copies are gone.
  target = DecoderConfig(vocab_size=1024, d_model=8192, num_layers=2, num_heads=16,
                         num_kv_heads=16, head_dim=128, mlp_dim=16384, dtype="bfloat16",
                         param_dtype="bfloat16")
  temps = {}
  for layouts in ("default", "auto"):
    run = AotRun("v5e:2x2", DecoderLM(target), (("draft", DecoderLM(_DRAFT)),), gammas=(4,),
                 batch_size=1, prompt_len=128, max_new_tokens=8, cache_len=256,
                 programs=("draft",), draft_replicated=False, param_layouts=layouts)
    r = run_aot(run, progress=lambda m: None)
    (p,) = r["programs"]
    assert p["error"] is None and r["param_layouts"] == layouts
    temps[layouts] = p["temp_bytes"]
  assert "weights in the compiler's layouts" in r["markdown"]
  # One layer's q kernel per device is 8.4 MB: the default layouts hold copies of several.
  assert temps["default"] - temps["auto"] > 8 << 20, temps
  with pytest.raises(ValueError, match="param_layouts must be one of"):
    AotRun("v5e:2x2", DecoderLM(_DEC), param_layouts="fast")


def test_tiny_t5_compiles_for_v5e():
  t5 = T5(t5_config("t5-v1_1-tiny", dtype="bfloat16", param_dtype="bfloat16"))
  devices = chips.topology_devices("v5e:2x2")
  mesh = Mesh(np.array(devices).reshape(1, 4), ("data", "model"))
  lowered = lower_ar_loop(t5, mesh, batch_size=4, prompt_len=16, max_new_tokens=4, cache_len=24)
  rep = compile_program(lowered, chips.chip("v5e"))
  assert rep.error is None and rep.fits and rep.loop is not None
  assert rep.loop["host_transfers"] == 0


def test_the_fused_attention_kernel_compiles_for_v5e(tmp_path):
  """`attention_kernel="pallas"`: the AR loop compiles for a TPU with each decode
  step's cache attention one Mosaic kernel per layer, run per shard (kv heads over
  `model`), with the same collectives as XLA's attention."""
  mesh = Mesh(np.array(chips.topology_devices("v5e:2x2")).reshape(1, 4), (DATA, MODEL))
  reps, hlo = {}, {}
  for kern in ("xla", "pallas"):
    lowered = lower_ar_loop(DecoderLM(_DEC.replace(attention_kernel=kern)), mesh, batch_size=8,
                            prompt_len=120, max_new_tokens=8, cache_len=256)
    reps[kern] = compile_program(lowered, chips.chip("v5e"), hlo_path=str(tmp_path / kern))
    hlo[kern] = (tmp_path / kern).read_text()
  assert reps["pallas"].error is None and reps["pallas"].fits
  assert hlo["pallas"].count('custom_call_target="tpu_custom_call"') == _DEC.num_layers
  assert "tpu_custom_call" not in hlo["xla"]
  assert reps["pallas"].loop["collectives"] == reps["xla"].loop["collectives"]


def test_compile_errors_are_reported_not_raised():
  class Broken:
    name, kind, slices = "broken", "ar", {}
    tokens_per_call, draft_calls = 1, 0

    class lowered:  # noqa: N801 - stands in for jax.stages.Lowered
      @staticmethod
      def compile():
        raise RuntimeError("RESOURCE_EXHAUSTED: out of HBM\nmore")
  rep = compile_program(Broken(), chips.chip("v5e"))
  assert rep.error == "RESOURCE_EXHAUSTED: out of HBM" and not rep.fits


def test_bad_runs_are_refused():
  with pytest.raises(ValueError, match="programs must be among"):
    AotRun("v5e:2x2", DecoderLM(_DEC), programs=("ar", "nope"))
  with pytest.raises(ValueError, match="mesh 2x4 needs 8 devices"):
    run_aot(AotRun("v5e:2x2", DecoderLM(_DEC), mesh=(2, 4)), progress=lambda m: None)


def test_replan_names_the_smallest_slice_that_fits():
  """`replan` (no compilation) recomputes where a run that did not fit would: Llama-3.1-8B
  at 32 rows x 32k slots holds a 137.4 GB bf16 KV cache (32 x 32768 x 32 layers x 8 kv
  heads x 128 x 2 x 2 bytes), more than a v5e-8's 8 x 16 GB, so at least 16 chips."""
  cfg = decoder_config("llama-3.1-8b", dtype="bfloat16", param_dtype="bfloat16",
                       prefill_chunk=64)
  run = AotRun("v5e:2x4", DecoderLM(cfg), batch_size=32, prompt_len=32512,
               max_new_tokens=128, cache_len=32768, programs=("ar",))
  hbm = chips.chip("v5e").hbm_bytes
  out = replan({"mesh": [1, 8], "fits": False, "programs": []}, run)
  n, (data, model) = out["smallest_fitting"]["chips"], out["smallest_fitting"]["mesh"]
  assert n >= 16 and data * model <= n and 32 % data == 0
  plan = memory_plan(cfg, mesh_shape=(data, model), batch_size=32, cache_len=32768,
                     activation_tokens=64, prompt_len=32512, logit_tokens=5)
  assert plan.per_device_bytes <= hbm
  with pytest.raises(ValueError, match="no mesh of"):
    choose_mesh(cfg, num_devices=n // 2, batch_size=32, cache_len=32768, capacity_bytes=hbm,
                activation_tokens=64, prompt_len=32512, logit_tokens=5)
  assert "smallest_fitting" not in replan({"mesh": [1, 8], "fits": True, "programs": []}, run)


def test_runs_from_the_launchers_configs():
  """What `python -m specjax.aot --config=...` compiles: the shapes the launcher would
  run (trained here: the config's model sections; paper presets: the named shapes)."""
  from configs import chen_chinchilla, leviathan_t5
  from specjax.aot.from_config import run_from_config
  chen = chen_chinchilla.get_config("micro")
  run = run_from_config(chen, "v5e:2x2")
  assert run.topology == "v5e:2x2" and run.gammas == (2,) and run.batch_size == 2
  assert run.prompt_len == 32 and run.max_new_tokens == 8
  assert run.target.config.d_model == 32 and run.drafts[0][1].config.d_model == 16
  assert run.target.config.vocab_size == chen.data.vocab_size
  paper = run_from_config(chen_chinchilla.get_config("paper"), "v4:2x2x4")
  assert paper.target.config.num_layers == 80 and paper.target.config.dtype == "bfloat16"
  assert dict(paper.drafts)["draft"].config.d_model == 6144
  lev = run_from_config(leviathan_t5.get_config("paper"), "v4:1x1x1", programs=("ar",))
  assert lev.target.config.d_model == 4096 and sorted(dict(lev.drafts)) == ["base", "large",
                                                                              "small"]
  assert lev.gammas == (1, 2, 3, 5, 7) and lev.programs == ("ar",)
  with pytest.raises(ValueError, match="no topology"):
    run_from_config(chen)


def test_tree_drafters_compile_for_v5e():
  """EAGLE's static and dynamic trees, Medusa and the EAGLE head's sharded train step
  compile for a TPU (EAGLE-2's dynamic
  tree once hit a libtpu gather-simplifier RET_CHECK; `verify.tree_verify` and the
  drafter avoid the gathers that triggered it)."""
  small = DecoderConfig(vocab_size=512, d_model=128, num_layers=1, num_heads=2, num_kv_heads=2,
                        head_dim=64, mlp_dim=256, dtype="bfloat16", param_dtype="bfloat16")
  run = AotRun("v5e:2x2", DecoderLM(small), gammas=(2,), batch_size=2, prompt_len=16,
               max_new_tokens=4, programs=("eagle_static", "eagle_tree", "medusa", "train_eagle"),
               eagle_tree=(2, 2, 4), medusa_heads=2, train_batch=4, train_seq_len=16)
  r = run_aot(run, progress=lambda m: None)
  names = [p["name"] for p in r["programs"]]
  assert names == ["train EAGLE-1 head", "speculative EAGLE-1 static tree 8 nodes",
                   "speculative EAGLE-1 dynamic tree 5 nodes", "speculative Medusa chain 2"]
  for p in r["programs"]:
    assert p["error"] is None and p["fits"] and p["loop"]["host_transfers"] == 0, p["name"]


def test_a_split_eagle_head_is_laid_out_megatron_style():
  """`draft_replicated=False`: the head's kernels and its cache split over `model`
  (`param_spec`, `suffix_spec`), its activations pinned (`EagleConfig.split`): per head
  call 1 embedding all-reduce, 1 all-gather of fc's output, 2 all-reduces (o, down) and 1
  all-gather of the logits — no weight gathered, no all-to-all; replicated: 1 + 1."""
  run = AotRun("v5e:2x2", DecoderLM(_DEC), gammas=(3,), batch_size=8, prompt_len=120,
               max_new_tokens=8, cache_len=256, programs=("eagle_chain",))
  by = {}
  for split in (False, True):
    r = run_aot(dataclasses.replace(run, draft_replicated=not split), progress=lambda m: None)
    (p,) = r["programs"]
    assert p["error"] is None and p["fits"] and p["loop"]["hbm_copies"] == []
    by[split] = p
  target = 2 * _DEC.num_layers + 1   # all-reduces of the verify call; + 1 logits all-gather
  for split, (reduces, gathers) in ((False, (1, 1)), (True, (3, 2))):
    coll = by[split]["loop"]["collectives"]
    assert set(coll) == {"all-reduce", "all-gather"}, coll
    # 3 head calls per iteration + the feedback's pairs (embedding, and fc when split).
    assert coll["all-reduce"]["count"] == target + 3 * reduces + 1, (split, coll)
    assert coll["all-gather"]["count"] == 1 + 3 * gathers + split, (split, coll)
  # The head's params and cache: a quarter per device when split.
  whole, split = by[False]["slices"], by[True]["slices"]
  assert split["draft_params"] < 0.3 * whole["draft_params"]
  assert split["draft_cache"] < 0.3 * whole["draft_cache"]
  assert 0.9 <= by[True]["plan"]["ratio"] <= 1.1
  # Each head call reads the target's LM head (vocab-split: a quarter per device), counted
  # in what an iteration must read beside the head's own params and cache.
  for p in by.values():
    s = p["slices"]
    assert s["draft_shared"] == _DEC.d_model * _DEC.vocab_size * 2 // 4
    assert p["expected_bytes"] == s["target_params"] + s["target_cache"] + 3 * (
        s["draft_params"] + s["draft_cache"] + s["draft_shared"])
    # The target's embedding and LM head, passed again inside the drafter's params, are
    # one buffer each: the compiler's second count of them is not held twice.
    assert p["shared_argument_bytes"] == 2 * s["draft_shared"]
    assert 0.9 <= p["plan"]["ratio"] <= 1.1, p["plan"]
    assert p["plan"]["prompt_hidden_width"] == _DEC.d_model


def test_large_sampled_logits_stay_split_over_the_vocabulary():
  """At batch 64 × 32k tokens the logits of every call are above
  `rules.GATHER_MAX_BYTES` per device: they stay split over the vocabulary and the
  sampler works piece by piece (`sampling.vocab_shards`). Per iteration the only
  all-gathers left are the γ + 1 draws' piece masses (`[B, M]` float32 each), never a
  `[B, T, V]` block of logits (before: 42 MB gathered per iteration)."""
  from specjax.sampling import SamplingConfig
  big = DecoderConfig(vocab_size=32768, d_model=256, num_layers=1, num_heads=4, num_kv_heads=4,
                      head_dim=128, mlp_dim=512, dtype="bfloat16", param_dtype="bfloat16")
  gamma, batch = 4, 64
  run = AotRun("v5e:2x2", DecoderLM(big), (("draft", DecoderLM(big)),), gammas=(gamma,),
               batch_size=batch, prompt_len=16, max_new_tokens=4, programs=("draft",),
               draft_replicated=False, sampling=SamplingConfig(1.0))
  (p,) = run_aot(run, progress=lambda m: None)["programs"]
  assert p["error"] is None and p["fits"] and p["loop"]["hbm_copies"] == []
  gathers = p["loop"]["collectives"]["all-gather"]
  assert gathers["count"] == gamma + 1, p["loop"]["collectives"]
  assert gathers["bytes"] <= (gamma + 1) * batch * 4 * 4, gathers
