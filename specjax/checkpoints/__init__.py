"""Checkpoints: orbax save/restore with config, transformers-format import/export."""
from specjax.checkpoints.orbax_io import save_params, restore_params
from specjax.checkpoints.hf_common import load_state_dict, save_safetensors, check_state_dict
