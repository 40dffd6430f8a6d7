"""Runtime settings of the CPU backend and the bridge to the compiled core (``openkda._C``).

CPU precision
    The CPU backend computes in fp32 by default (as the GPU accumulates). Tests and the
    ``python -m openkda`` checker switch it to fp64 either with the environment variable
    ``OPENKDA_CPU_PRECISION=f64`` (read at import) or locally::

        with openkda.cpu_precision("f64"):
            o, ht = openkda.chunk_kda(...)

    In fp64 mode, state outputs of CPU calls (``final_state``, ``dh0``) are fp64 instead of fp32.
    The setting is ignored on CUDA (always fp32 accumulation).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

import torch
from torch.utils.dlpack import to_dlpack

from . import _C

_PRECISIONS = ("f32", "f64")
_state = threading.local()
_default_precision = os.environ.get("OPENKDA_CPU_PRECISION", "f32")
if _default_precision not in _PRECISIONS:
    raise ValueError(
        f"OPENKDA_CPU_PRECISION = {_default_precision!r}; expected one of {_PRECISIONS}"
    )


def get_cpu_precision() -> str:
    """The CPU backend's compute precision for calls made now: ``"f32"`` or ``"f64"``."""
    return getattr(_state, "precision", _default_precision)


@contextlib.contextmanager
def cpu_precision(precision: str) -> Iterator[None]:
    """Context manager selecting the CPU backend's compute precision (``"f32"`` or ``"f64"``)."""
    if precision not in _PRECISIONS:
        raise ValueError(f"precision = {precision!r}; expected one of {_PRECISIONS}")
    previous = get_cpu_precision()
    _state.precision = precision
    try:
        yield
    finally:
        _state.precision = previous


def state_dtype(device: torch.device, precision: str) -> torch.dtype:
    """dtype of state outputs: fp32, or fp64 for CPU calls in fp64 precision."""
    return torch.float64 if (precision == "f64" and device.type == "cpu") else torch.float32


_NO_WORKSPACE = frozenset({"recurrent_fwd", "gate_fwd"})


def detached_contiguous(t: torch.Tensor) -> torch.Tensor:
    """A contiguous view of t that does not require grad (what DLPack can export): t itself when it
    already is one (detach costs ~1 us of host time per tensor), else ``t.detach().contiguous()``
    (a copy for a strided tensor)."""
    if not t.requires_grad and t.is_contiguous():
        return t
    return t.detach().contiguous()


def run_core(op: str, device: torch.device, tensors: dict, options: dict) -> None:
    """Validates, allocates the workspace and runs one core op on the current stream.

    ``tensors`` maps the core's Args field names to tensors (or None). Each crosses as a DLPack
    capsule of ``detached_contiguous(t)``, made by ``torch.utils.dlpack.to_dlpack`` (a C
    function): the binding would otherwise call the Python ``Tensor.__dlpack__`` of every tensor,
    ~5 us each on the H200's host, about half of the binding's host time per chunk_kda call. One
    binding call (``<op>_run``) validates, asks for the workspace (a torch uint8 tensor on
    ``device``) and runs; ops without a workspace call ``<op>`` directly.
    """
    capsules = {n: None if t is None else to_dlpack(detached_contiguous(t))
                for n, t in tensors.items()}
    if device.type == "cuda":
        # torch's raw current-stream query (what Triton and Inductor launch on): ~0.1 us, where
        # torch.cuda.current_stream() builds a Stream object (~5 us on the H200's host).
        if device.index == torch._C._cuda_getDevice():  # no device switch to make
            _call(op, device, capsules, options, torch._C._cuda_getCurrentRawStream(device.index))
        else:
            with torch.cuda.device(device):
                _call(op, device, capsules, options,
                      torch._C._cuda_getCurrentRawStream(device.index))
    else:
        _call(op, device, capsules, options, 0)


def _call(op: str, device: torch.device, tensors: dict, options: dict, stream: int) -> None:
    if op in _NO_WORKSPACE:  # workspace_bytes is 0 for these ops on every device
        getattr(_C, op)(tensors, options, None, stream)
    else:
        getattr(_C, op + "_run")(
            tensors, options,
            lambda n: to_dlpack(torch.empty(n, dtype=torch.uint8, device=device)), stream)


def build_config() -> dict:
    """Optional parts compiled into this build.

    Returns ``{'cuda': bool, 'cuda_archs': str, 'version': str}``.
    """
    return dict(_C.build_config())
