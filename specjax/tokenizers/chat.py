"""What instruct checkpoints add next to ``tokenizer.json``: several EOS ids and a chat template.

An instruct model ends a turn on any of several ids (Llama-3.x Instruct: ``<|eot_id|>``,
``<|eom_id|>``, ``<|end_of_text|>``), the ``eos_token_id`` of ``generation_config.json`` (else
``config.json``) that transformers' ``generate`` stops on; its prompts are conversations
rendered by the ``chat_template`` (in ``tokenizer_config.json`` or ``chat_template.jinja``).

`HFTokenizer` reads both, so `specjax.generate(..., eos_id=tok.eos_ids)` stops where
transformers does. The template is rendered as transformers renders it (a sandboxed Jinja
environment with ``trim_blocks`` / ``lstrip_blocks``, ``raise_exception`` and
``strftime_now``, and transformers' ``{% generation %} ... {% endgeneration %}`` block, whose
content is emitted as it is: transformers uses the block only to mark the assistant's characters
for ``return_assistant_tokens_mask``, which specjax does not build); its text is tokenized without
adding special tokens (the template writes them).
"""

from __future__ import annotations

import datetime
import functools
import json
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from specjax.tokenizers import _files

__all__ = ["read_eos_ids", "read_chat_template", "render_chat"]

GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def _read_json(path: str) -> Optional[dict]:
  """The JSON object in `path` (local or a URL), None when absent."""
  if not _files.is_file(path):
    return None
  try:
    value = json.loads(_files.read_text(path))
  except (OSError, ValueError) as e:
    raise ValueError(f"{path} is not valid JSON: {e}") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
  return value


def read_eos_ids(directory: str, vocab_size: int, fallback: Optional[int]) -> Tuple[int, ...]:
  """The ids that end generation for the checkpoint in `directory`: ``eos_token_id`` (an int
  or a list) of ``generation_config.json``, else of ``config.json``, else `fallback` (None:
  ()). An id outside [0, vocab_size) is a ValueError naming the file."""
  for name in (GENERATION_CONFIG, "config.json"):
    path = _files.join(directory, name)
    config = _read_json(path)
    if config is None or config.get("eos_token_id") is None:
      continue
    value = config["eos_token_id"]
    ids = value if isinstance(value, list) else [value]
    for i in ids:
      if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size:
        raise ValueError(f"{path}: eos_token_id must be an id in [0, {vocab_size}) or a list "
                         f"of them, got {value!r}")
    return tuple(dict.fromkeys(ids))
  return () if fallback is None else (fallback,)


def read_chat_template(directory: str) -> Optional[str]:
  """The checkpoint's chat template: ``chat_template.jinja``, else ``tokenizer_config.json``'s
  ``chat_template`` (a string, or a list of ``{"name", "template"}``: "default"); else None."""
  path = _files.join(directory, CHAT_TEMPLATE_FILE)
  if _files.is_file(path):
    return _files.read_text(path)
  config_path = _files.join(directory, "tokenizer_config.json")
  template = (_read_json(config_path) or {}).get("chat_template")
  if template is None or isinstance(template, str):
    return template
  if isinstance(template, list):
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
    if "default" in named:
      return named["default"]
    raise ValueError(f"{config_path}: chat_template lists {sorted(named)} but no 'default'")
  raise ValueError(f"{config_path}: chat_template must be a string or a list of named "
                   f"templates, got {type(template).__name__}")


@functools.lru_cache(maxsize=None)
def _generation_extension() -> type:
  """The jinja2 extension of transformers' ``{% generation %}`` tag: the block's body renders in
  its own scope (a call block, as transformers compiles it, so a ``set`` inside stays inside) and
  its output is returned unchanged."""
  import jinja2  # pylint: disable=import-outside-toplevel
  from jinja2 import ext, nodes  # pylint: disable=import-outside-toplevel

  class GenerationBlock(ext.Extension):
    """``{% generation %}...{% endgeneration %}``: the body's text, as it is."""

    tags = {"generation"}

    def parse(self, parser: "jinja2.parser.Parser") -> nodes.Node:
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.CallBlock(self.call_method("_emit"), [], [], body).set_lineno(lineno)

    def _emit(self, caller: Callable[[], str]) -> str:
      return caller()

  return GenerationBlock


def _raise(message: str):
  raise ValueError(f"the chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
  return datetime.datetime.now().strftime(fmt)


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = True,
                special_tokens: Optional[Dict[str, Optional[str]]] = None,
                **variables: Any) -> str:
  """`messages` (``[{"role": ..., "content": ...}, ...]``) rendered by the Jinja `template` as
  transformers' ``apply_chat_template`` renders it; `special_tokens` (``bos_token`` /
  ``eos_token`` / ``pad_token``) and `variables` (e.g. ``tools``) are visible to the template.

  Raises:
    ImportError: jinja2 is not installed.
    TypeError: `messages` is not a list of dicts with a role.
    ValueError: the template raised (its `raise_exception`), or is invalid.
  """
  try:
    import jinja2  # pylint: disable=import-outside-toplevel
    from jinja2 import sandbox  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("chat templates need jinja2 (pip install jinja2)") from e
  if isinstance(messages, (str, bytes)) or not all(
      isinstance(m, Mapping) and "role" in m for m in messages):
    raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts, got "
                    f"{messages!r}")
  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=["jinja2.ext.loopcontrols",
                                                          _generation_extension()])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise
  env.globals["strftime_now"] = _strftime_now
  try:
    compiled = env.from_string(template)
  except jinja2.TemplateError as e:
    raise ValueError(f"the chat template is not valid Jinja: {e}") from None
  context: Dict[str, Any] = dict(special_tokens or {})
  context.update(variables)
  return compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                         **context)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators: Optional[Tuple[str, str]] = None, sort_keys: bool = False) -> str:
  # Jinja's own tojson escapes HTML characters; transformers' does not.
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)
