import numpy as np
import pytest
import torch

from flashstate.device import upload


@pytest.mark.parametrize(
    ("data", "dtype"),
    [
        ([3, 1, 2], torch.int64),
        (np.arange(5, dtype=np.int32), torch.int64),
        ([True, False], torch.bool),
        ([], torch.int64),
    ],
)
def test_upload_to_the_cpu_gives_the_values_in_the_dtype(data, dtype):
    out = upload(data, dtype, "cpu")
    assert out.dtype == dtype and out.device.type == "cpu"
    assert out.tolist() == [bool(x) if dtype == torch.bool else int(x) for x in data]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_upload_to_cuda_returns_before_the_work_queued_ahead_of_it_has_run():
    torch.cuda._sleep(2_000_000_000)  # about a second of device time queued on the stream
    queued = torch.cuda.Event()
    queued.record()
    out = upload(list(range(1000)), torch.int64, "cuda")
    assert not queued.query()  # a blocking copy would have waited for the sleep to end
    torch.cuda.synchronize()
    assert out.tolist() == list(range(1000))
