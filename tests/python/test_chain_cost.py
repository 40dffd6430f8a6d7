"""benchmarks/chain_cost.py on the CPU: the rows it times split the same tokens into the stated
sequences or dense rows, with or without the two states, and bad flags are refused by name (its
timings need CUDA)."""

import pathlib
import sys

import pytest
import torch

_BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(_BENCH))
import chain_cost  # noqa: E402


@pytest.mark.parametrize("dense", [False, True], ids=["varlen", "dense"])
@pytest.mark.parametrize("states", [True, False], ids=["states", "no_states"])
def test_rows_split_the_same_tokens(dense, states):
    heads, tokens, n = 2, 1024, 8
    pos, kw = chain_cost.inputs(heads, tokens, n, dense, states, device="cpu")
    q, k, v, g, beta = pos
    rows, per_row = (n, tokens // n) if dense else (1, tokens)
    assert q.shape == k.shape == g.shape == (rows, per_row, heads, 128)
    assert v.shape == (rows, per_row, heads, 128) and beta.shape == (rows, per_row, heads)
    if dense:
        assert "cu_seqlens" not in kw
    else:
        assert kw["cu_seqlens"].tolist() == list(range(0, tokens + 1, tokens // n))
    if states:
        assert kw["initial_state"].shape == (n, heads, 128, 128) and kw["output_final_state"]
    else:
        assert kw["initial_state"] is None and not kw["output_final_state"]
    # the dense rows are the varlen sequences, reshaped
    flat, _ = chain_cost.inputs(heads, tokens, n, False, states, device="cpu")
    assert torch.equal(q.reshape(1, tokens, heads, 128), flat[0])


@pytest.mark.parametrize("flags", [["--tokens", "100"], ["--tokens", "1000"], ["--heads", "0"],
                                   ["--repeat", "0"]])
def test_bad_flags_are_refused_by_name(flags, capsys):
    with pytest.raises(SystemExit) as exc:
        chain_cost.main(flags)
    assert exc.value.code == 2
    assert f"{flags[0]} {flags[1]}" in capsys.readouterr().err
