"""Signature parity with FLA 0.6.0 (``fla-core==0.6.0``, ``fla/ops/kda``).

The expectations below are literal copies of the wheel's signatures (parameter name, annotation
and default in source form, in order). ``test_signatures_match_wheel`` additionally parses the
wheel itself with ``ast`` (the wheel cannot be imported without triton and a GPU): it is downloaded
with ``pip download --no-deps fla-core==0.6.0`` into the pytest cache, or read from
``$OPENKDA_FLA_WHEEL`` (a .whl path), and the test is skipped when neither is available.
"""

import ast
import inspect
import os
import subprocess
import sys
import zipfile

import pytest

import openkda

EXPECTED = {
    "chunk_kda": ("fla/ops/kda/chunk.py", None, [
        "q: torch.Tensor",
        "k: torch.Tensor",
        "v: torch.Tensor",
        "g: torch.Tensor",
        "beta: torch.Tensor",
        "scale: float | None = None",
        "initial_state: torch.Tensor | None = None",
        "output_final_state: bool = False",
        "use_qk_l2norm_in_kernel: bool = False",
        "use_gate_in_kernel: bool = False",
        "use_beta_sigmoid_in_kernel: bool = False",
        "allow_neg_eigval: bool = False",
        "safe_gate: bool = False",
        "lower_bound: float | None = None",
        "disable_recompute: bool = False",
        "return_intermediate_states: bool = False",
        "state_v_first: bool = False",
        "cu_seqlens: torch.LongTensor | None = None",
        "cu_seqlens_cpu: torch.LongTensor | None = None",
        "cp_context: FLACPContext | None = None",
        "use_graph: bool = False",
        "max_num_seqs: int | None = None",
        "**kwargs",
    ]),
    "fused_recurrent_kda": ("fla/ops/kda/fused_recurrent.py", "tuple[torch.Tensor, torch.Tensor]", [
        "q: torch.Tensor",
        "k: torch.Tensor",
        "v: torch.Tensor",
        "g: torch.Tensor",
        "beta: torch.Tensor",
        "A_log: torch.Tensor | None = None",
        "dt_bias: torch.Tensor | None = None",
        "scale: float | None = None",
        "initial_state: torch.Tensor = None",
        "output_final_state: bool = False",
        "use_qk_l2norm_in_kernel: bool = False",
        "use_gate_in_kernel: bool = False",
        "use_beta_sigmoid_in_kernel: bool = False",
        "allow_neg_eigval: bool = False",
        "lower_bound: float | None = None",
        "state_v_first: bool = False",
        "cu_seqlens: torch.LongTensor | None = None",
        "**kwargs",
    ]),
    "fused_recurrent_kda_fwd": ("fla/ops/kda/fused_recurrent.py",
                                "tuple[torch.Tensor, torch.Tensor]", [
        "q: torch.Tensor",
        "k: torch.Tensor",
        "v: torch.Tensor",
        "g: torch.Tensor",
        "beta: torch.Tensor",
        "A_log: torch.Tensor | None = None",
        "dt_bias: torch.Tensor | None = None",
        "initial_state: torch.Tensor | None = None",
        "scale: float | None = None",
        "output_final_state: bool = False",
        "inplace_final_state: bool = True",
        "state_v_first: bool = False",
        "cu_seqlens: torch.LongTensor | None = None",
        "ssm_state_indices: torch.Tensor | None = None",
        "num_accepted_tokens: torch.Tensor | None = None",
        "use_qk_l2norm_in_kernel: bool = False",
        "use_gate_in_kernel: bool = False",
        "use_beta_sigmoid_in_kernel: bool = False",
        "allow_neg_eigval: bool = False",
        "lower_bound: float | None = None",
        "out: torch.Tensor | None = None",
        "**kwargs",
    ]),
    "fused_kda_gate": ("fla/ops/kda/gate.py", "torch.Tensor | tuple[torch.Tensor, torch.Tensor]", [
        "g: torch.Tensor",
        "A_log: torch.Tensor | None = None",
        "dt_bias: torch.Tensor | None = None",
        "lower_bound: float | None = None",
        "output_dtype: torch.dtype = torch.float32",
    ]),
    "naive_kda_gate": ("fla/ops/kda/gate.py", "torch.Tensor", [
        "g: torch.Tensor",
        "A_log: torch.Tensor",
        "dt_bias: torch.Tensor | None = None",
        "output_dtype: torch.dtype = torch.float32",
    ]),
    "naive_kda_lowerbound_gate": ("fla/ops/kda/gate.py", "torch.Tensor", [
        "g: torch.Tensor",
        "A_log: torch.Tensor | None = None",
        "dt_bias: torch.Tensor | None = None",
        "lower_bound: float = -5.0",
        "output_dtype: torch.dtype = torch.float32",
    ]),
}


def _ours(name):
    """[param strings], return annotation of openkda's function, in the wheel's source form."""
    sig = inspect.signature(getattr(openkda, name))
    parts = []
    for p in sig.parameters.values():
        if p.kind == p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
            continue
        if p.kind == p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            continue
        assert p.kind == p.POSITIONAL_OR_KEYWORD, f"{name}.{p.name}: {p.kind}"
        s = p.name
        if p.annotation is not p.empty:
            s += f": {p.annotation}"
        if p.default is not p.empty:
            s += f" = {p.default!r}"
        parts.append(s)
    ret = None if sig.return_annotation is sig.empty else str(sig.return_annotation)
    return parts, ret


def _from_ast(fn: ast.FunctionDef):
    a = fn.args
    assert not a.posonlyargs and not a.kwonlyargs
    defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
    parts = []
    for p, d in zip(a.args, defaults):
        s = p.arg
        if p.annotation is not None:
            s += f": {ast.unparse(p.annotation)}"
        if d is not None:
            s += f" = {ast.unparse(d)}"
        parts.append(s)
    if a.vararg:
        parts.append(f"*{a.vararg.arg}")
    if a.kwarg:
        parts.append(f"**{a.kwarg.arg}")
    return parts, (ast.unparse(fn.returns) if fn.returns is not None else None)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_signature_literal(name):
    _, ret, params = EXPECTED[name]
    ours, our_ret = _ours(name)
    assert ours == params
    assert our_ret == ret


def _wheel_path(cache_dir) -> str:
    path = os.environ.get("OPENKDA_FLA_WHEEL")
    if path:
        return path
    os.makedirs(cache_dir, exist_ok=True)
    for f in os.listdir(cache_dir):
        if f.startswith("fla_core-0.6.0") and f.endswith(".whl"):
            return os.path.join(cache_dir, f)
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--retries", "1",
             "--timeout", "15", "fla-core==0.6.0", "-d", cache_dir],
            check=True, timeout=180, capture_output=True)
    except (subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"fla-core==0.6.0 could not be downloaded (PyPI unreachable?): {e}")
    for f in os.listdir(cache_dir):
        if f.startswith("fla_core-0.6.0") and f.endswith(".whl"):
            return os.path.join(cache_dir, f)
    pytest.skip("pip download fla-core==0.6.0 produced no wheel")


def test_signatures_match_wheel(request, tmp_path_factory):
    # pytest's cache keeps the download between runs; without the cache plugin
    # (-p no:cacheprovider) a per-session temporary folder does.
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("fla-core-0.6.0") if cache else tmp_path_factory.mktemp("fla-core-0.6.0")
    wheel = _wheel_path(str(folder))
    with zipfile.ZipFile(wheel) as z:
        sources = {f: z.read(f).decode() for f in {e[0] for e in EXPECTED.values()}}
    for name, (path, ret, params) in EXPECTED.items():
        tree = ast.parse(sources[path])
        fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        assert len(fns) == 1, f"{name} not found in {path}"
        wheel_params, wheel_ret = _from_ast(fns[0])
        assert wheel_params == params, f"{name}: the literal expectation differs from the wheel"
        assert wheel_ret == ret, name
        assert _ours(name) == (wheel_params, wheel_ret), name


def test_exports():
    for name in ("chunk_kda", "fused_recurrent_kda", "fused_recurrent_kda_fwd", "fused_kda_gate",
                 "naive_kda_gate", "naive_kda_lowerbound_gate", "supports", "__version__"):
        assert hasattr(openkda, name), name
    assert isinstance(openkda.__version__, str) and openkda.__version__
    cfg = openkda.build_config()
    assert set(cfg) == {"cuda", "cuda_archs", "version"}
