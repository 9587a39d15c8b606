import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("the Triton norms run on CUDA", allow_module_level=True)
triton_norm = pytest.importorskip("flashstate.ops.norm.triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_norms_match_the_torch_forms(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, 4, 256, device="cuda", generator=g).to(dtype)
    z = torch.randn(300, 4, 256, device="cuda", generator=g).to(dtype)
    w = (torch.randn(256, device="cuda", generator=g) * 0.1).to(dtype)
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(
        triton_norm.rms_norm(x, w, 1e-6, offset=1.0).float(), normed * (1 + w.float()), **tol
    )
    want = w.float() * normed * F.silu(z.float())
    torch.testing.assert_close(triton_norm.gated_rms_norm(x, z, w, 1e-6).float(), want, **tol)
