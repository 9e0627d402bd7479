"""Chat templates with transformers' `{% generation %} ... {% endgeneration %}` block (the part
transformers marks for `return_assistant_tokens_mask`): rendered as transformers renders them,
on a tiny tokenizer written here (no hub download)."""

import json

import pytest

from specjax.tokenizers import HFTokenizer
from specjax.tokenizers.chat import render_chat

tokenizers = pytest.importorskip("tokenizers")

# The shape of SmolLM / Qwen-style training templates: the assistant's turn inside a generation
# block, whitespace control on the tags, a `set` inside the block (scoped to it, as transformers
# compiles the block into a call), a loop control, and a generation block left empty.
TEMPLATE = (
    "{{ bos_token }}{% set turn = 'outer' %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|start|>assistant\n"
    "{%- generation -%}\n"
    "{% set turn = 'inner' %}{{ message['content'] | trim }}{{ turn }}<|eot|>\n"
    "{%- endgeneration %}\n"
    "{% else %}<|start|>{{ message['role'] }}\n{{ message['content'] }}<|eot|>\n"
    "{% endif %}{% if loop.index > 4 %}{% break %}{% endif %}{% endfor %}"
    "{{ turn }}{% generation %}{% endgeneration %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}")
MESSAGES = [{"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Where is the cat?"},
            {"role": "assistant", "content": "  On the sofa. "},
            {"role": "user", "content": "And the dog?"},
            {"role": "assistant", "content": "Outside."}]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
  from tokenizers import models, pre_tokenizers
  words = ["<unk>", "<s>", "</s>", "<|start|>", "<|eot|>", "assistant", "user", "system"]
  tok = tokenizers.Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)},
                                              unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(["<s>", "</s>", "<|start|>", "<|eot|>"])
  directory = tmp_path_factory.mktemp("chat_generation")
  tok.save(str(directory / "tokenizer.json"))
  (directory / "tokenizer_config.json").write_text(json.dumps(
      {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE,
       "tokenizer_class": "PreTrainedTokenizerFast"}))
  return str(directory)


def test_generation_block_renders_as_transformers(tokenizer_dir):
  transformers = pytest.importorskip("transformers")
  ours = HFTokenizer(tokenizer_dir)
  theirs = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
  for messages in (MESSAGES, MESSAGES[:2], MESSAGES[:3]):
    for prompt in (True, False):
      want = theirs.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
      assert ours.apply_chat_template(messages, add_generation_prompt=prompt,
                                      tokenize=False) == want
  # The block's text is there as it is, and its `set` stayed inside it.
  assert "<|start|>assistantOn the sofa.inner<|eot|>" in want and want.endswith("outer")


def test_generation_tag_errors_are_named():
  with pytest.raises(ValueError, match="not valid Jinja"):
    render_chat("{% generation %}unclosed", [{"role": "user", "content": "x"}])
  with pytest.raises(ValueError, match="not valid Jinja"):
    render_chat("{% endgeneration %}", [{"role": "user", "content": "x"}])
