"""Drafters: where the drafts of speculative decoding come from, behind one protocol.

  drafter = specjax.drafters.PromptLookup(max_ngram=3)
  out = specjax.speculative_generate(target, tp, drafter, None, prompts, lengths,
                                     max_new_tokens=64, gamma=8)

`speculative_generate` takes a draft model (it becomes a `ModelDrafter`) or any drafter. The
protocol is `specjax.drafting` (re-exported here); Medusa's and EAGLE's head networks are in
`specjax.models`. One small module per family:

  model          ModelDrafter   a separate draft model (Leviathan / Chen)
  parallel       ParallelDraft  a draft model trained with mask slots (PARD): γ drafts per call
  prompt_lookup  PromptLookup   copies what followed the last n-gram earlier in the row
  layer_skip     LayerSkip      the target through a subset of its layers
  windowed       WindowedKV     the target over sink + recent-window KV only
  lookahead      Lookahead      Jacobi iteration + n-gram pool, verified in one call
  medusa         Medusa         extra heads on the target's hidden state; a token tree
  suffix         SuffixDraft    a tree of continuations of the row's suffix from its history,
                                the other rows and a corpus (SuffixCorpus)
  eagle          Eagle          a one-layer head on the target's features (EAGLE-1/3),
                                static trees or EAGLE-2's dynamic tree (DynamicTree)
  dflash         DFlash         a block draft of several layers over the target's fused
                                context features (DFlash): a chain or a static tree per call
"""

from specjax.drafters.dflash import DFlash, DFlashState, load_dflash
from specjax.drafters.eagle import DynamicTree, Eagle, load_eagle
from specjax.drafters.layer_skip import LayerSkip, LayerSkipLM
from specjax.drafters.lookahead import Lookahead, LookaheadState
from specjax.drafters.medusa import Medusa, choose_tree, load_medusa
from specjax.drafters.model import ModelDrafter
from specjax.drafters.parallel import ParallelDraft, ParallelState, load_parallel_draft
from specjax.drafters.prompt_lookup import LookupState, PromptLookup
from specjax.drafters.suffix import SuffixCorpus, SuffixDraft, outputs_of
from specjax.drafters.windowed import WindowCache, WindowedKV, WindowedLM
from specjax.checkpoints.heads import read_agreement
from specjax.drafting import (CallLayout, DraftFeedback, DraftInput, Drafter, Proposal,
                              chain_layout, is_drafter)
from specjax.models.dflash_head import DFlashConfig, init_dflash
from specjax.models.eagle_head import EagleConfig, init_eagle
from specjax.models.medusa_head import MedusaConfig, init_heads

__all__ = ["CallLayout", "DraftFeedback", "DraftInput", "Drafter", "Proposal", "chain_layout",
           "is_drafter", "ModelDrafter", "ParallelDraft", "ParallelState", "load_parallel_draft",
           "PromptLookup", "LookupState", "SuffixDraft",
           "SuffixCorpus", "outputs_of", "LayerSkip",
           "LayerSkipLM", "WindowedKV", "WindowedLM", "WindowCache", "Lookahead",
           "LookaheadState", "Medusa", "MedusaConfig", "init_heads", "choose_tree", "load_medusa",
           "Eagle", "EagleConfig", "DynamicTree", "init_eagle", "load_eagle", "read_agreement",
           "DFlash", "DFlashConfig", "DFlashState", "init_dflash", "load_dflash"]
