"""snippets.ckpt.coords against ShardedTensors built by hand with Megatron's own constructor."""

import torch

from snippets.ckpt import coords as ckpt_coords


def _rows(rank, replicated_replica):
    from megatron.core.dist_checkpointing import ShardedTensor

    layers = []
    for layer in range(2):  # a (layer, rows, cols) tensor: one layer axis, rows split over 2 "TP" ranks
        local = torch.zeros(3, 4)
        layers.append(
            ShardedTensor.from_rank_offsets(
                "w", local, (0, layer, 2), (1, rank, 2), replica_id=(0, 0, 0), prepend_axis_num=1
            )
        )
    norm = ShardedTensor.from_rank_offsets("norm", torch.zeros(4), replica_id=replicated_replica)
    return ckpt_coords.coordinate_rows({"w0": layers[0], "w1": layers[1], "norm": norm})


def test_rows_carry_offsets_fragmentations_and_replica():
    row = next(r for r in _rows(1, (0, 1, 0)) if r["local_key"] == "w1")
    assert row["key"] == "w" and row["global_shape"] == (2, 6, 4) and row["local_shape"] == (3, 4)
    assert row["global_offset"] == (1, 3, 0) and row["axis_fragmentations"] == (2, 2, 1)
    assert row["prepend_axis_num"] == 1 and row["replica_id"] == (0, 0, 0)


def test_written_pieces_tile_once_and_a_second_main_replica_is_caught():
    good = ckpt_coords.written_pieces([_rows(0, (0, 0, 0)), _rows(1, (0, 1, 0))])
    assert good == {"norm": (1, True), "w": (4, True)}
    twice = ckpt_coords.written_pieces([_rows(0, (0, 0, 0)), _rows(1, (0, 0, 0))])
    assert twice["norm"] == (2, False)
    gap = ckpt_coords.written_pieces([_rows(0, (0, 0, 0))])
    assert gap["w"] == (2, False)
