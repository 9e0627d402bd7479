"""Parameter dtypes: casting a parameter tree between float32 and bfloat16.

A model's config names `param_dtype` (storage) and `dtype` (compute): "float32", "bfloat16" or
"float16". Models compute in `dtype` whatever the weights' dtype, keep layer norms, rotary
angles, attention scores and softmax in float32, and return float32 logits. `cast_params`
turns a tree from one parameter dtype into another (e.g. bfloat16: half the bytes a step reads).
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
    params: a parameter tree (nested dicts of `jax.Array` or numpy arrays; either layout of
      `DecoderLM`, or a `T5` tree).
    dtype: a floating dtype or its name ("float32", "bfloat16", "float16").

  Returns:
    A tree of the same structure: floating leaves cast (round to nearest even), others and
    leaves already in `dtype` as they are. A `jax.Array` keeps its sharding; numpy stays numpy.

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
