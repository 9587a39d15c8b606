"""Stacked projections: one GEMM over the rows of several Linears whose checkpoint parameters stay."""

import torch
import torch.nn.functional as F
from torch import nn

from flashstate.layers.stacked_linear import StackedLinears, is_stacked


class GateUp(StackedLinears):
    stacked_names = ("gate", "up")

    def __init__(self):
        super().__init__()
        self.gate, self.up = nn.Linear(8, 5, bias=False), nn.Linear(8, 3, bias=False)


def _built():
    with torch.device("meta"):
        m = GateUp()
    return m.to_empty(device="cpu")  # as the loader builds models


def test_weights_are_views_of_one_stack_that_survives_casts_and_loads():
    m = _built()
    assert is_stacked(m._stacked, [m.gate, m.up])
    assert set(m.state_dict()) == {"gate.weight", "up.weight"}
    assert m.gate.weight.shape == (5, 8) and m.up.weight.shape == (3, 8)
    with torch.no_grad():  # a checkpoint load writes into the parameters: the stack sees it
        m.gate.weight.copy_(torch.randn(5, 8))
        m.up.weight.copy_(torch.randn(3, 8))
    x = torch.randn(4, 8)
    torch.testing.assert_close(F.linear(x, m.stacked_weight()), torch.cat([m.gate(x), m.up(x)], dim=-1))
    m = m.to(torch.float64)
    w = m.stacked_weight()
    assert w.dtype == torch.float64 and w.data_ptr() == m.gate.weight.data_ptr()
    assert torch.equal(w[5:], m.up.weight)


def test_a_replaced_weight_falls_back_to_a_concatenated_copy():
    m = _built()
    with torch.no_grad():  # to_empty leaves whatever the memory held, NaN bit patterns included
        m.gate.weight.copy_(torch.randn(5, 8))
    m.up.weight = nn.Parameter(torch.randn(3, 8))
    assert not is_stacked(m._stacked, [m.gate, m.up])
    assert torch.equal(m.stacked_weight(), torch.cat([m.gate.weight, m.up.weight]))


def test_meta_modules_have_no_stack_yet():
    with torch.device("meta"):
        m = GateUp()
    assert m._stacked is None and not is_stacked(m._stacked, [m.gate, m.up])
    assert m.to(torch.float16)._stacked is None
