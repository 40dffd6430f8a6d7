"""Independent float64 torch reference of KDA, written from the math (spec §1.1, §3).

Per sequence and value head ``hv`` (q/k head ``hv // G``), state ``S`` ``[K, V]``:

    S   = Diag(exp(g_t)) S                 decay (per K row)
    r_t = v_t - S^T k_t                    delta against the decayed state
    S   = S + k_t (beta_t * r_t)^T         write (beta_t scalar, or per V element if headwise)
    o_t = S^T (scale * q_t)                read with the updated state

Everything runs in float64 on whatever tensors are passed (they are upcast), so gradients come from
torch autograd through this per-token loop. Nothing here calls openkda.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dim (eps inside the sqrt, spec §3.5)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + exp(x)), or x above 20 (spec §3.2)."""
    return torch.where(x > 20, x, torch.log1p(torch.exp(torch.clamp(x, max=20))))


def gate(
    g_raw: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    lower_bound: Optional[float],
) -> torch.Tensor:
    """Per-token log-decay from the raw gate ``[..., HV, K]`` (spec §3.1, §3.2), float64.

    softplus mode (lower_bound None): -exp(A_log[hv]) * softplus(x), x = g_raw + dt_bias[hv, :];
    A_log None there means exp(A_log) = e (FLA's recurrent kernel).
    lower-bound mode: lower_bound * sigmoid(a * x), a = exp(A_log[hv]) or 1.
    """
    HV, K = g_raw.shape[-2:]
    x = g_raw.double()
    if dt_bias is not None:
        x = x + dt_bias.double().reshape(HV, K)
    if lower_bound is None:
        a = A_log.double().reshape(HV, 1).exp() if A_log is not None else math.e
        return -a * softplus(x)
    if A_log is not None:
        x = A_log.double().reshape(HV, 1).exp() * x
    return lower_bound * torch.sigmoid(x)


def beta_activation(beta: torch.Tensor, use_sigmoid: bool, allow_neg_eigval: bool) -> torch.Tensor:
    """beta as used by the recurrence (spec §3.4)."""
    b = beta.double()
    if use_sigmoid:
        b = torch.sigmoid(b) * (2.0 if allow_neg_eigval else 1.0)
    return b


def _sequences(B: int, T: int, cu_seqlens: Optional[Sequence[int]]):
    """(batch row, first token, length) of every sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = [int(x) for x in cu_seqlens]
    return [(0, cu[n], cu[n + 1] - cu[n]) for n in range(len(cu) - 1)]


def kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    lower_bound: Optional[float] = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Sequence[int]] = None,
    initial_slots: Optional[Sequence[torch.Tensor]] = None,
    return_token_states: bool = False,
):
    """KDA in float64.

    q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g ``[B, T, HV, K]`` (log-decay, or the raw gate
    with use_gate_in_kernel); beta ``[B, T, HV]`` or headwise ``[B, T, HV, V]``;
    initial_state ``[N, HV, K, V]`` (``[N, HV, V, K]`` when state_v_first) or None;
    cu_seqlens: a list/tensor of N + 1 offsets (B must be 1). ``initial_slots``, when given,
    overrides the initial state per sequence (a list of ``[HV, K, V]`` / ``[HV, V, K]`` tensors).

    Returns ``(o, final_state)`` (o ``[B, T, HV, V]``, final ``[N, HV, K, V]`` in the requested
    layout), plus, with return_token_states, the list of states after every token (``[B * T]`` in
    packed token order, each ``[HV, K, V]`` / ``[HV, V, K]``).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    scale = K ** -0.5 if scale is None else scale
    q, k, v = q.double(), k.double(), v.double()
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q.repeat_interleave(G, dim=2)
    k = k.repeat_interleave(G, dim=2)
    g = gate(g, A_log, dt_bias, lower_bound) if use_gate_in_kernel else g.double()
    b = beta_activation(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    headwise = b.dim() == 4

    def load(state):  # -> [HV, K, V]
        return state.double().transpose(-1, -2) if state_v_first else state.double()

    def store(state):
        return state.transpose(-1, -2) if state_v_first else state

    o_rows, finals, token_states = [], [], [None] * (B * T)
    o = [[None] * T for _ in range(B)]
    for n, (row, bos, length) in enumerate(_sequences(B, T, cu_seqlens)):
        if initial_slots is not None:
            S = load(initial_slots[n])
        elif initial_state is not None:
            S = load(initial_state[n])
        else:
            S = q.new_zeros(HV, K, V)
        for t in range(bos, bos + length):
            S = S * torch.exp(g[row, t])[:, :, None]
            r = v[row, t] - torch.einsum("hkv,hk->hv", S, k[row, t])
            r = r * (b[row, t] if headwise else b[row, t][:, None])
            S = S + k[row, t][:, :, None] * r[:, None, :]
            o[row][t] = torch.einsum("hkv,hk->hv", S, q[row, t] * scale)
            token_states[row * T + t] = store(S)
        finals.append(store(S))
    for row in range(B):
        cols = [o[row][t] if o[row][t] is not None else v.new_zeros(HV, V) for t in range(T)]
        o_rows.append(torch.stack(cols) if T else v.new_zeros(0, HV, V))
    out = torch.stack(o_rows)
    final = torch.stack(finals) if finals else v.new_zeros(
        (0, HV, V, K) if state_v_first else (0, HV, K, V))
    if return_token_states:
        return out, final, token_states
    return out, final


def chunk_start_states(
    token_states: list,
    initial: list,
    B: int,
    T: int,
    chunk_size: int,
    cu_seqlens: Optional[Sequence[int]] = None,
) -> torch.Tensor:
    """``h`` of return_intermediate_states: the state entering every chunk ``[B, NT, HV, ..]``.

    ``initial`` holds each sequence's initial state (already in the output layout).
    """
    rows = []
    seqs = _sequences(B, T, cu_seqlens)
    if cu_seqlens is None:
        for row, _, length in seqs:
            rows.append([initial[row] if c == 0 else token_states[row * T + c * chunk_size - 1]
                         for c in range(math.ceil(length / chunk_size))])
    else:
        flat = []
        for n, (_, bos, length) in enumerate(seqs):
            flat += [initial[n] if c == 0 else token_states[bos + c * chunk_size - 1]
                     for c in range(math.ceil(length / chunk_size))]
        rows.append(flat)
    return torch.stack([torch.stack(r) for r in rows])


def rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    """FLA's ratio metric: RMS(ref - out) / (RMS(ref) + 1e-8), computed in float64."""
    ref, out = ref.double(), out.double()
    if ref.numel() == 0:
        return 0.0
    return ((ref - out).pow(2).mean().sqrt() / (ref.pow(2).mean().sqrt() + 1e-8)).item()
