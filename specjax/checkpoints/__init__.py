"""Checkpoints: orbax save/restore with config, transformers-format import/export; local paths or
URLs (`gs://...`, through `etils.epath`)."""
from specjax.checkpoints.hf_common import check_state_dict, load_state_dict, save_safetensors
from specjax.checkpoints.hf_llama import export_hf_decoder, import_hf_decoder
from specjax.checkpoints.hf_t5 import export_hf_t5, import_hf_t5
from specjax.checkpoints.integrity import CheckpointError, params_digest
from specjax.checkpoints.orbax_io import read_config, restore_params, save_params
from specjax.checkpoints.streaming import MissingTorchError
