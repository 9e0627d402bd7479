"""JAX's own SPMD, nothing home-made: `sharding` (the (data, model) mesh and the `PartitionSpec`s
of params, caches and inputs: Megatron-style model axis, rows over data), `rules` (layouts by
shape suffix) and `distributed` (one process per host, `jax.distributed`; process 0 writes)."""
