"""supports(): can OpenKDA run a given chunk_kda call here? (an FLA backend verifier's hook)."""

from __future__ import annotations

import inspect

import torch

from . import _ops
from ._config import get_cpu_precision
from .chunk import _check_fla_args, _deprecated_state_layout, chunk_kda

__all__ = ["supports"]

_SIGNATURE = inspect.signature(chunk_kda)
_cache: dict = {}


def _probe_key(a: dict, kw: dict) -> tuple:
    def desc(t):
        return None if t is None else (t.dtype, t.device, tuple(t.shape[2:]), t.requires_grad)
    flags = tuple((n, a[n]) for n in (
        "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
        "allow_neg_eigval", "safe_gate", "lower_bound", "state_v_first", "output_final_state"))
    tensors = tuple(desc(a[n]) for n in ("q", "k", "v", "g", "beta", "initial_state"))
    params = tuple(None if kw.get(n) is None else (kw[n].dtype, kw[n].device, tuple(kw[n].shape))
                   for n in ("A_log", "dt_bias"))
    return flags + tensors + params + (kw.get("chunk_size", 64), torch.is_grad_enabled())


def _probe(a: dict, kw: dict) -> None:
    """Runs forward (and backward when grads are needed) on one token of the real geometry."""
    def tiny(t):
        return None if t is None else t.detach()[:1, :1].contiguous()
    q, k, v, g, beta = (tiny(a[n]) for n in ("q", "k", "v", "g", "beta"))
    h0 = a["initial_state"]
    h0 = None if h0 is None else h0.detach()[:1].contiguous()
    A_log, dt_bias = kw.get("A_log"), kw.get("dt_bias")
    A_log = None if A_log is None else A_log.detach()
    dt_bias = None if dt_bias is None else dt_bias.detach()
    opts = dict(
        scale=1.0,
        **_ops.kernel_options("chunk_kda", **{n: a[n] for n in (
            "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
            "allow_neg_eigval", "lower_bound")}),
        safe_gate=bool(a["safe_gate"]), chunk_size=int(kw.get("chunk_size", 64)),
        state_v_first=bool(a["state_v_first"]), precision=get_cpu_precision())
    if not a["use_gate_in_kernel"]:
        A_log = dt_bias = None
    o, ht, _ = _ops._chunk_fwd(q, k, v, g, beta, A_log, dt_bias, h0, None,
                               output_final_state=bool(a["output_final_state"]), **opts)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad
        for t in (a["q"], a["k"], a["v"], a["g"], a["beta"], a["initial_state"],
                  kw.get("A_log"), kw.get("dt_bias")))
    if needs_grad:
        _ops._chunk_bwd(q, k, v, g, beta, A_log, dt_bias, h0, None, torch.ones_like(o),
                        ht if ht.numel() else None, **opts)


def supports(**kwargs) -> tuple[bool, str]:
    """Whether ``chunk_kda(**kwargs)`` can run with OpenKDA on the tensors' device.

    Like FLA's backend verifiers it judges the configuration (flags, dtypes, devices, H, HV, K,
    V, A_log / dt_bias sizes), not the consistency of B, T and N across tensors, which the call
    itself validates. Takes chunk_kda's arguments by keyword (``q=..., k=..., ..., A_log=...``). Returns
    ``(True, "")`` or ``(False, reason)``, where reason is the error chunk_kda would raise
    (ValueError for invalid arguments, NotImplementedError for a configuration this build or
    device cannot run, e.g. a CUDA op without a kernel yet). Runs FLA's argument checks, then a
    one-token probe of the same geometry, dtypes, flags and device (cached per configuration).
    Never raises; mirrors FLA's ``chunk_kda_verifier`` backends hook.
    """
    try:
        bound = _SIGNATURE.bind(**kwargs)
    except TypeError as e:
        return False, f"chunk_kda: {e}"
    bound.apply_defaults()
    a = dict(bound.arguments)
    kw = dict(a.pop("kwargs", {}))
    try:
        a["state_v_first"] = _deprecated_state_layout(kw, a["state_v_first"])
        if a["return_intermediate_states"] and a["disable_recompute"]:
            return False, "return_intermediate_states must be used with disable_recompute=False"
        _check_fla_args(a["q"], a["initial_state"], a["cu_seqlens"], a["cp_context"], kw,
                        a["use_gate_in_kernel"], a["lower_bound"], a["safe_gate"],
                        a["allow_neg_eigval"], a["use_beta_sigmoid_in_kernel"])
        cu = a["cu_seqlens"]
        if cu is not None and (cu.dtype not in (torch.int32, torch.int64) or cu.dim() != 1
                               or cu.device != a["q"].device):
            raise ValueError(f"chunk_kda: cu_seqlens: {cu.dtype} {tuple(cu.shape)} on "
                             f"{cu.device}; expected i32 | i64 [N + 1] on {a['q'].device}")
        key = _probe_key(a, kw)
        if key not in _cache:
            try:
                _probe(a, kw)
                _cache[key] = (True, "")
            except (ValueError, NotImplementedError) as e:
                _cache[key] = (False, str(e))
        return _cache[key]
    except (ValueError, NotImplementedError, AttributeError, IndexError, TypeError,
            RuntimeError) as e:  # RuntimeError: an internal core error or out of memory
        return False, str(e)
