import torch

from flashstate.ops.attention.tiles import tile_list


def test_a_steps_attention_layers_share_one_tile_list():
    """Built once per step for the metadata's `cu` (identity), again for any other."""
    cu = torch.tensor([0, 3, 40, 41])
    first = tile_list(cu, 16, 8)
    assert tile_list(cu, 16, 8) is first
    assert first[0].tolist() == [0, 1, 1, 1, 2, -1, -1, -1] and first[1].tolist()[:5] == [0, 0, 16, 32, 0]
    other = tile_list(cu.clone(), 16, 8)
    assert other is not first and all(torch.equal(a, b) for a, b in zip(other, first, strict=True))
    assert tile_list(cu, 8, 12) is not first
