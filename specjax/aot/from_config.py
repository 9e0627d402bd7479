"""An experiment config (Leviathan or Chen launcher) → the `AotRun` of its shapes.

Reads what the launcher would run: the target and draft shapes (the config's model sections,
or for real checkpoints the named shapes `cfg.aot.target` / `cfg.aot.drafts`: no checkpoint is
read), the γ values, the largest batch, the prompt bucket, the new tokens and the dtype.
"""

from __future__ import annotations

from typing import Any, Optional

from specjax.aot.run import AotRun
from specjax.models.decoder import DecoderLM, decoder_config
from specjax.models.sections import decoder_from_section, t5_from_section
from specjax.models.t5 import T5, t5_config

__all__ = ["run_from_config", "run_from_names"]


def _named(name: str, dtype: str):
  kw = dict(dtype=dtype, param_dtype=dtype)
  if name.startswith("t5"):
    return T5(t5_config(name, **kw))
  return DecoderLM(decoder_config(name, **kw))


def run_from_names(target: str, drafts=(), topology: str = "", **fields: Any) -> AotRun:
  """The `AotRun` of named shapes (`specjax.DECODER_CONFIGS` / `T5_CONFIGS`), no config file.

  `specjax-aot --target=llama-3.1-8b --drafts=llama-3.2-1b --topology=v5e:2x4` from an installed
  wheel. `fields`: `AotRun` fields (gammas, batch_size, prompt_len, max_new_tokens, ...) and
  `dtype` (default bfloat16, as the checkpoints are served).
  """
  if not topology:
    raise ValueError("no topology: pass --topology=v5e:2x4")
  dtype = str(fields.pop("dtype", "bfloat16"))
  t5 = target.startswith("t5")
  for name in drafts:
    if name.startswith("t5") != t5:
      raise ValueError(f"drafts={list(drafts)!r}: draft {name!r} is not of the target "
                       f"{target!r}'s family (T5 drafts for T5 targets, decoders for decoders)")
  return AotRun(topology=topology, target=_named(target, dtype),
                drafts=tuple((n, _named(n, dtype)) for n in drafts), **fields)


def _retyped(model, dtype: str):
  return type(model)(model.config.replace(dtype=dtype, param_dtype=dtype))


def run_from_config(cfg, topology: Optional[str] = None, **overrides: Any) -> AotRun:
  """The `AotRun` of a Leviathan / Chen config (`overrides`: `AotRun` fields)."""
  topology = topology or cfg.get("aot_topology", "")
  if not topology:
    raise ValueError("no topology: pass --topology=v5e:2x4 (or set config.aot_topology)")
  dtype = str(cfg.get("dtype", "float32"))
  aot = cfg.get("aot", None)
  leviathan = "drafts" in cfg.models
  vocab = int(cfg.data.vocab_size)
  if aot is not None and aot.get("target", ""):
    target = _named(aot.target, dtype)
    drafts = tuple((str(n), _named(str(m), dtype)) for n, m in aot.drafts.items())
  elif leviathan:
    target = _retyped(t5_from_section(cfg.models.target, vocab), dtype)
    drafts = tuple((n, _retyped(t5_from_section(m, vocab), dtype))
                   for n, m in cfg.models.drafts.items())
  else:
    target = _retyped(decoder_from_section(cfg.models.target, vocab), dtype)
    drafts = (("draft", _retyped(decoder_from_section(cfg.models.draft, vocab), dtype)),)
  if leviathan:
    gammas = tuple(int(g) for g in cfg.eval.gammas)
    prompt_len, new = int(cfg.data.input_len), int(cfg.data.target_len)
    batch = 1
  else:
    gammas = tuple(int(k) for k in cfg.eval.ks if int(k) > 0)
    prompt_len = max(int(cfg.eval.xsum_prompt_len), int(cfg.eval.humaneval_prompt_len))
    new = int(cfg.eval.max_new_tokens)
    batch = max(int(b) for b in cfg.eval.batch_sizes)
  if aot is not None:
    gammas = tuple(int(g) for g in aot.get("gammas", gammas)) or gammas
    prompt_len = int(aot.get("prompt_len", prompt_len))
    new = int(aot.get("max_new_tokens", new))
    batch = int(aot.get("batch_size", batch))
  fields = dict(topology=topology, target=target, drafts=drafts, gammas=gammas,
                batch_size=batch, prompt_len=prompt_len, max_new_tokens=new,
                draft_replicated=not bool(cfg.models.get("draft_sharded", False)))
  fields.update(overrides)
  return AotRun(**fields)
