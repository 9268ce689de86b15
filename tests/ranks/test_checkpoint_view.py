"""snippets.ckpt.checkpoint_view against a real dist_checkpointing save of a TP=2-split tensor."""

import torch

from snippets.ckpt import checkpoint_view as cv
from snippets.ranks.launch import run_ranks


def _save_split(ckpt_dir):
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing import ShardedTensor

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    rank = parallel_state.get_tensor_model_parallel_rank()
    full = torch.arange(24.0).reshape(6, 4)
    local = full[rank * 3 : (rank + 1) * 3].clone()
    sd = {
        "w": ShardedTensor.from_rank_offsets("w", local, (0, rank, 2), replica_id=0),
        "b": ShardedTensor.from_rank_offsets("b", torch.ones(4), replica_id=rank),
    }
    dist_checkpointing.save(sd, ckpt_dir)
    return cv.sharded_rows(sd)


def test_rows_files_and_chunks_match_what_was_saved(tmp_path):
    ckpt_dir = str(tmp_path)
    rows = run_ranks(_save_split, 2, ckpt_dir, timeout=120)
    w1 = next(r for r in rows[1] if r[0] == "w")
    assert w1[1:6] == ["w", "ShardedTensor", (6, 4), (3, 4), (3, 0)]
    b1 = next(r for r in rows[1] if r[0] == "b")
    assert not cv.is_main_replica(b1[6]) and cv.is_main_replica((0, 0, 0))
    assert cv.stored_tensors(ckpt_dir) == {"b": (4,), "w": (6, 4)}
    assert cv.stored_chunks(ckpt_dir, "w") == [((0, 0), (3, 4)), ((3, 0), (3, 4))]
    assert cv.stored_chunks(ckpt_dir, "b") == [((0,), (4,))]  # the replica on rank 1 is not written
    files = cv.saved_files(ckpt_dir)
    assert ".metadata" in files and "metadata.json" in files and all(not f.startswith("/") for f in files)
    assert cv.metadata_json(ckpt_dir)["sharded_backend"] == "torch_dist"
