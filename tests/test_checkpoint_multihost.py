"""Train states split over two processes are saved and restored sharded (orbax)."""

import os
import textwrap

from multiprocess import run_two_processes

_WORKER = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh
    from specjax.models.decoder import DecoderLM, decoder_config
    from specjax.parallel.distributed import initialize_distributed
    from specjax.training.checkpoint import Checkpointer
    from specjax.training.mesh import shard_state
    from specjax.training.optim import OptimizerSpec
    from specjax.training.steps import StepSpec, TrainState, init_params, init_state

    pid, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    initialize_distributed(True, coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid)
    # The model axis spans both processes: every leaf fsdp-split over it is half on each.
    mesh = Mesh(np.array(jax.devices()).reshape(1, 8), ("data", "model"))
    lm = DecoderLM(decoder_config("tiny", vocab_size=64, num_layers=2))
    spec = StepSpec(lm, OptimizerSpec())
    state = shard_state(init_state(spec, init_params(lm, 0), 0), mesh)
    state = state.replace(step=state.step + 7)
    emb = state.params["embed"]["embedding"]
    split = not emb.is_fully_addressable
    ckpt = Checkpointer(workdir, keep=2)
    ckpt.save(7, state.to_dict(), {"note": "two processes"})
    ckpt.wait()
    like = shard_state(init_state(spec, init_params(lm, 1), 0), mesh)   # other values
    back = TrainState.from_dict(ckpt.restore(7, like.to_dict()))
    same_layout = all(a.sharding == b.sharding for a, b in zip(
        jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(like)))
    want = multihost_utils.process_allgather(state, tiled=True)
    got = multihost_utils.process_allgather(back, tiled=True)
    equal = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
        jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)))
    local = [s.data.shape for s in emb.addressable_shards]
    ckpt.close()
    print("RESULT " + json.dumps(dict(split=split, equal=equal, same_layout=same_layout,
                                      step=int(np.asarray(got.step)), meta=ckpt.restore_meta(7),
                                      local_shapes=[list(s) for s in local])), flush=True)
    jax.distributed.shutdown()
    """)


def test_two_processes_save_and_restore_a_sharded_train_state(tmp_path):
  """Two local CPU processes of 4 devices each, a train state fsdp-split over a
  model axis spanning both: `Checkpointer.save` writes it without gathering it
  to one host (each process holds and writes half of every split leaf),
  `restore` into a sharded state of other values brings back every leaf
  exactly, in the same layout."""
  workdir = str(tmp_path / "run")
  for r in run_two_processes(_WORKER, tmp_path, workdir):
    assert r["split"], "the embedding should span both processes"
    # Each process holds its 4 devices' slices of the [64, 32] embedding: 64 / 8 rows each.
    assert r["local_shapes"] == [[8, 32]] * 4
    assert r["equal"] and r["same_layout"] and r["step"] == 7
    assert r["meta"] == {"note": "two processes"}
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "7", "state"))
