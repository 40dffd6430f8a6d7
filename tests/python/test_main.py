"""``python -m openkda`` (the workload checker) and torch.compile over the custom ops."""

import subprocess
import sys

import torch

import openkda
from openkda.__main__ import main
from cases import Case, assert_close, make_inputs


def test_main_small(capsys):
    rc = main(["--T", "130", "--H", "2", "--HV", "4", "--K", "32", "--V", "16", "--quiet",
               "--gate", "lower_bound", "--chunk-size", "32"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for word in ("forward", "backward", "tokens/s", "o ", "dq", "dA_log", "result  : ok"):
        assert word in out, out


def test_main_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "openkda", "--T", "64", "--H", "1", "--K", "16",
                        "--V", "16", "--device", "cpu", "--quiet", "--check-T", "32"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "on [1, 32]" in r.stdout


def test_custom_ops_under_torch_compile():
    """The ops trace (fake tensors, functionalization of the in-place pool update)."""
    case = Case(B=1, T=20, H=2, HV=2, K=16, V=8, gate="softplus", beta="sigmoid")
    a = make_inputs(case)

    def step(q, k, v, g, beta, A_log, h0):
        y = torch.ops.openkda.gate_fwd(g, A_log, None)
        o, ht, _ = torch.ops.openkda.chunk_fwd(q, k, v, y, beta, None, None, h0, None, scale=0.25,
                                               output_final_state=True,
                                               use_beta_sigmoid_in_kernel=True)
        pool = ht.clone()
        out = torch.empty_like(v)
        torch.ops.openkda.recurrent_fwd(q, k, v, y, beta, None, None, pool, None, None, None, out,
                                        None, scale=0.25, use_beta_sigmoid_in_kernel=True,
                                        inplace_final_state=True)
        return o * 2, pool, out

    args = (a["q"], a["k"], a["v"], a["g"], a["beta"], a["A_log"], a["initial_state"])
    eager = step(*args)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(*args)
    for name, e, c in zip(("o", "pool", "out"), eager, compiled):
        assert_close(name, e, c, 1e-6)
    assert openkda.supports(**{n: a[n] for n in ("q", "k", "v", "g", "beta")})[0]
