"""Python API behaviour on CUDA tensors that does not belong to one kernel's test file."""

import subprocess
import sys

import pytest
import torch

import openkda

pytestmark = pytest.mark.gpu


def _inputs(requires_grad):
    B, T, H, K = 1, 20, 2, 64
    dev = "cuda"
    q, k = (torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device=dev)).to(torch.bfloat16)
    beta = torch.rand(B, T, H, device=dev, dtype=torch.bfloat16)
    for t in (q, k, v, g, beta):
        t.requires_grad_(requires_grad)
    return q, k, v, g, beta


def test_chunk_kda_cuda_training_fails_before_the_forward():
    q, k, v, g, beta = _inputs(requires_grad=True)
    with pytest.raises(NotImplementedError, match="CUDA backward of chunk_kda"):
        openkda.chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)


def test_chunk_kda_cuda_forward_runs_without_grad():
    q, k, v, g, beta = _inputs(requires_grad=True)
    with torch.no_grad():
        o, ht = openkda.chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
                                  output_final_state=True)
    assert o.shape == v.shape and o.dtype == q.dtype and ht.dtype == torch.float32
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()


def test_main_job_runs_on_a_gpu_machine():
    r = subprocess.run([sys.executable, "-m", "openkda", "--quiet", "--T", "256", "--H", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "result  : ok" in r.stdout and "device :" in r.stdout
