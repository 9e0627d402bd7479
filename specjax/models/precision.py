"""Parameter dtypes: casting a parameter tree between float32 and bfloat16.

A model's config names two dtypes: `param_dtype`, what the weights are
stored in, and `dtype`, what layers compute in (both "float32", "bfloat16"
or "float16"). Either model computes in its `dtype` whatever the weights'
dtype (each layer casts its operands), keeps the precision-sensitive parts
in float32 (layer norms, rotary angles, attention scores and softmax) and
returns float32 logits. `cast_params` turns a tree made or restored in one
parameter dtype into another, e.g. float32 weights into bfloat16 ones to
halve their memory and the bytes a decoding step reads.
"""

from __future__ import annotations

from typing import Any, Union

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["cast_params"]

DTypeLike = Union[str, Any]


def cast_params(params: Any, dtype: DTypeLike) -> Any:
  """`params` with every floating-point leaf cast to `dtype`.

  Args:
    params: a parameter tree (nested dicts of `jax.Array` or numpy arrays;
      either layout of `DecoderLM`, or a `T5` tree).
    dtype: a floating dtype or its name ("float32", "bfloat16", "float16"),
      e.g. `model.config.param_dtype`.

  Returns:
    A tree of the same structure. Floating leaves are cast (rounding to
    nearest even); leaves already in `dtype` and non-floating leaves
    (integer or boolean buffers) are returned as they are. A `jax.Array`
    stays on its devices with its sharding; a numpy leaf stays numpy.

  Raises:
    TypeError: `dtype` is not a floating dtype.

  Example:
    >>> bf16 = DecoderLM(config.replace(dtype="bfloat16", param_dtype="bfloat16"))
    >>> bf16_params = cast_params(float32_params, bf16.config.param_dtype)
  """
  target = jnp.dtype(dtype)
  if not jnp.issubdtype(target, jnp.floating):
    raise TypeError(f"dtype must be a floating dtype, got {target}")

  def cast(x):
    if not hasattr(x, "dtype"):
      x = np.asarray(x)
    if x.dtype == target or not jnp.issubdtype(x.dtype, jnp.floating):
      return x
    return x.astype(target)

  return jax.tree_util.tree_map(cast, params)
