#!/usr/bin/env bash
# GPU check of OpenKDA on one CUDA machine (H200: 16 cores, python3 with torch, Triton, nanobind,
# scikit-build-core, cmake, ninja, nvcc, compute-sanitizer; no network). One command:
#
#   bash scripts/gpu_check.sh
#
# Steps (status of each in $OUT/summary.md; logs beside it):
#   1. wheels     optional  pip install --no-deps --no-index $OPENKDA_WHEELS/*.whl (FLA 0.6.0)
#   2. gtest-src  optional  build GoogleTest from $OPENKDA_GTEST_SRC when none is installed
#   3. build      REQUIRED  pip install --no-build-isolation . with the CUDA backend (and the
#                           GoogleTest suite in the same CMake tree, build/gpu)
#   4. ctest      REQUIRED  GoogleTest suite (ctest in build/gpu)
#   5. pytest     REQUIRED  pytest -m gpu tests/python ("no tests" is recorded, not a failure)
#   6. checks     REQUIRED  benchmarks/bench_gate.py --check (fp64 reference, determinism)
#   7. bench      optional  benchmarks/bench_gate.py (vs FLA when it imports; copy-bandwidth floor)
#   8. bench_chunk optional benchmarks/bench_chunk_fwd.py (chunk_kda forward vs FLA; FLA's first
#                           call per shape autotunes for about 70 s, or compiles the choices of
#                           OPENKDA_FLA_AUTOTUNE in 4-6 s)
#   9. host_time  optional  benchmarks/host_time.py (a chunk_kda call's host time, by part)
#  10. bench_decode optional benchmarks/bench_decode.py (decode / verify, CUDA-graph replay)
#  11. memcheck   optional  compute-sanitizer memcheck on small gate, varlen chunk_kda (with
#                           initial and intermediate states), the time split, the prep / scan
#                           hand-off, state-pool decode cases, and
#                           malformed device-side cu_seqlens / state_indices (also with h)
#  12. racecheck  optional  compute-sanitizer racecheck on the same cases
# Exit status: non-zero only when a REQUIRED step fails. Optional steps are skipped when the time
# left before OPENKDA_GPU_CHECK_DEADLINE (seconds since start, default 540) is too short.
#
# Environment:
#   OUT                      output folder (default ./gpu_check_out)
#   OPENKDA_WHEELS           folder of wheels to install first (default .whl when it exists)
#   OPENKDA_GTEST_SRC        GoogleTest source tree (default .deps/googletest when it exists)
#   OPENKDA_BENCH_ARGS       extra bench_gate.py arguments (e.g. "--quick" or "--no-fla")
#   OPENKDA_BENCH_CHUNK_ARGS extra bench_chunk_fwd.py arguments (e.g. "--fla-cases B1-T8192-H96")
#   OPENKDA_COMMIT           commit id written into the reports when .git did not travel
#   OPENKDA_FLA_AUTOTUNE     a tarball of Triton autotune results (*.autotune.json in Triton's
#                            cache layout), unpacked into TRITON_CACHE_DIR before the steps
#                            (default benchmarks/fla_autotune/h200-triton3.6-fla0.6.0.tgz when it
#                            exists; "none" autotunes afresh). FLA 0.6.0 asks Triton to cache its
#                            autotune results on disk (FLA_CACHE_RESULTS, 1 unless set), so FLA runs
#                            the configs chosen when the tarball was made instead of timing every
#                            config again; a shape or a Triton without a cached result autotunes
#                            as before. The run's results, old and new, go to
#                            $OUT/fla-autotune.tgz
#   OPENKDA_SKIP=...         space-separated step names to skip (e.g. "racecheck bench")
#   OPENKDA_STEP_LIMITS=...  space-separated name=seconds time limits in place of the defaults
#                            below (e.g. "bench_chunk=240 memcheck=60"); an optional step is
#                            skipped when its limit would pass the deadline, so realistic limits
#                            let more of them run in a short session
#
# Carrying files to a machine without network (run here, in the repository root):
#   FLA wheels:  mkdir -p .whl && cp /path/to/fla_core-0.6.0-*.whl .whl/   (carry ".whl")
#   GoogleTest:  mkdir -p .deps && cp -r /usr/src/googletest .deps/         (carry ".deps")
#   CUTLASS/CuTe headers: not used by any kernel yet (the build has no CUTLASS option).
# shellcheck disable=SC2317  # step functions run through run_step (indirectly)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/gpu_check_out}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-python3}"
DEADLINE="${OPENKDA_GPU_CHECK_DEADLINE:-540}"
JOBS="$(nproc 2>/dev/null || echo 16)"
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
export PYTHONUNBUFFERED=1
export OPENKDA_ENABLE_CUDA=ON
export OPENKDA_CUDA_ARCHS="${OPENKDA_CUDA_ARCHS:-90a}"
# The H200 image's default CXX links libstdc++ statically into shared objects; next to torch's
# shared libstdc++ that breaks C++ runtime state in openkda._C. Build with the system compilers.
if [[ -x /usr/bin/g++ && -x /usr/bin/gcc ]]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
fi
if [[ -d /usr/local/cuda/bin && ":$PATH:" != *":/usr/local/cuda/bin:"* ]]; then
  export PATH="$PATH:/usr/local/cuda/bin"
fi
# OPENKDA_COMMIT first: the device machine's copy of .git may not follow the tree it runs.
COMMIT="${OPENKDA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
export OPENKDA_COMMIT="$COMMIT"
BUILD_DIR="build/gpu"
WHEELS="${OPENKDA_WHEELS:-}"
[[ -z "$WHEELS" && -d .whl ]] && WHEELS=".whl"
GTEST_SRC="${OPENKDA_GTEST_SRC:-}"
[[ -z "$GTEST_SRC" && -d .deps/googletest ]] && GTEST_SRC=".deps/googletest"
GTEST_PREFIX=/tmp/openkda-gtest
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
export FLA_CACHE_RESULTS="${FLA_CACHE_RESULTS:-1}"
FLA_AUTOTUNE="${OPENKDA_FLA_AUTOTUNE:-}"
DEFAULT_FLA_AUTOTUNE=benchmarks/fla_autotune/h200-triton3.6-fla0.6.0.tgz
[[ -z "$FLA_AUTOTUNE" && -f $DEFAULT_FLA_AUTOTUNE ]] && FLA_AUTOTUNE=$DEFAULT_FLA_AUTOTUNE
if [[ -n $FLA_AUTOTUNE && $FLA_AUTOTUNE != none ]] \
  && ! { mkdir -p "$TRITON_CACHE_DIR" && tar xzf "$FLA_AUTOTUNE" -C "$TRITON_CACHE_DIR"; }; then
  echo "OPENKDA_FLA_AUTOTUNE: cannot unpack '$FLA_AUTOTUNE'" >&2
  exit 2
fi
WITH_TESTS=OFF
# Read by the step functions, which run in child shells.
export PYTHON WHEELS GTEST_SRC GTEST_PREFIX BUILD_DIR WITH_TESTS

ROWS=()
REQUIRED_FAILED=0
declare -A STATUS

# run_step NAME KIND(required|optional) TIMEOUT_S LOG COMMAND...
run_step() {
  local name=$1 kind=$2 limit=$3 log=$4
  shift 4
  local t=$SECONDS st override
  for override in ${OPENKDA_STEP_LIMITS:-}; do
    [[ ${override%%=*} == "$name" ]] || continue
    limit=${override#*=}
    if [[ ! $limit =~ ^[0-9]+$ ]]; then
      echo "OPENKDA_STEP_LIMITS: '$override': expected name=seconds" >&2
      exit 2
    fi
  done
  if [[ " ${OPENKDA_SKIP:-} " == *" $name "* ]]; then
    st="SKIP (OPENKDA_SKIP)"
  elif [[ $kind == optional && $((SECONDS + limit)) -gt $DEADLINE ]]; then
    st="SKIP (time: $((DEADLINE - SECONDS)) s left)"
  else
    local left=$((DEADLINE + 50 - SECONDS))
    ((limit > left)) && limit=$left
    ((limit < 10)) && limit=10
    printf '\n==== %s (%s, limit %ss) -> %s ====\n' "$name" "$kind" "$limit" "$log"
    if declare -F "$1" >/dev/null; then  # a function of this script: run it in a child bash
      timeout --kill-after=10 "$limit" bash -o pipefail -c "$(declare -f "$1"); $1" \
        >>"$OUT/$log" 2>&1
    else
      timeout --kill-after=10 "$limit" "$@" >>"$OUT/$log" 2>&1
    fi
    local rc=$?
    if [[ $rc -eq 0 ]]; then st=PASS
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then st="FAIL (timeout ${limit}s)"
    elif [[ $rc -eq 5 && $name == pytest ]]; then st="NO TESTS (pytest exit 5)"
    else st="FAIL (exit $rc)"
    fi
    tail -n 25 "$OUT/$log"
  fi
  STATUS[$name]="$st"
  ROWS+=("| $name | $kind | $st | $((SECONDS - t)) | $log |")
  echo "---- $name: $st ($((SECONDS - t)) s)"
  if [[ $kind == required && $st == FAIL* ]]; then REQUIRED_FAILED=1; fi
  return 0
}

{
  echo "# gpu_check ($(date -u +%Y-%m-%dT%H:%M:%SZ), commit $COMMIT)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  "$PYTHON" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', \
torch.__version__, '| cuda', torch.version.cuda, '| device', torch.cuda.get_device_name(0) \
if torch.cuda.is_available() else 'none')" 2>&1
  command -v compute-sanitizer || echo "compute-sanitizer: not found"
  echo '```'
} >"$OUT/env.txt"
cat "$OUT/env.txt"

# ---- 1. wheels ---------------------------------------------------------------------------------
install_wheels() {
  shopt -s nullglob
  local whl=("$WHEELS"/*.whl)
  [[ ${#whl[@]} -gt 0 ]] || { echo "no wheels in $WHEELS"; return 1; }
  "$PYTHON" -m pip install --no-deps --no-index --no-cache-dir "${whl[@]}"
  "$PYTHON" -c "import fla, fla.ops.kda.gate; print('fla', fla.__version__)"
}
if [[ -n "$WHEELS" ]]; then
  run_step wheels optional 120 build.log install_wheels
else
  STATUS[wheels]="SKIP (no OPENKDA_WHEELS, no .whl)"
  ROWS+=("| wheels | optional | ${STATUS[wheels]} | 0 | - |")
fi

# ---- 2. GoogleTest -----------------------------------------------------------------------------
have_gtest() {
  [[ -f /usr/include/gtest/gtest.h || -f /usr/local/include/gtest/gtest.h \
     || -f $GTEST_PREFIX/include/gtest/gtest.h ]]
}
build_gtest() {
  cmake -S "$GTEST_SRC" -B /tmp/openkda-gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_GMOCK=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX="$GTEST_PREFIX" \
    && cmake --build /tmp/openkda-gtest-build && cmake --install /tmp/openkda-gtest-build
}
if have_gtest; then
  STATUS[gtest-src]="SKIP (GoogleTest installed)"
elif [[ -n "$GTEST_SRC" ]]; then
  run_step gtest-src optional 180 build.log build_gtest
else
  STATUS[gtest-src]="SKIP (no GoogleTest and no OPENKDA_GTEST_SRC)"
fi
have_gtest && WITH_TESTS=ON

# ---- 3. build ----------------------------------------------------------------------------------
build_package() {
  "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -v \
    -Cbuild-dir="$BUILD_DIR" \
    -Ccmake.define.OPENKDA_ENABLE_CUDA=ON \
    -Ccmake.define.OPENKDA_CUDA_ARCHS="$OPENKDA_CUDA_ARCHS" \
    -Ccmake.define.OPENKDA_BUILD_TESTS="$WITH_TESTS" \
    -Ccmake.define.GTest_ROOT="$GTEST_PREFIX" \
    . || return 1
  "$PYTHON" -c "import openkda; c = openkda.build_config(); print('build_config', c); \
assert c.get('cuda'), 'openkda was built without CUDA'"
}
run_step build required 420 build.log build_package

# ptxas resource report of our kernels (from the verbose build log).
ptxas_summary() {
  "$PYTHON" - "$OUT/build.log" <<'EOF'
import re, sys
text = open(sys.argv[1], errors="replace").read()
entries = re.findall(r"Compiling entry function '(\w+)' for '(\w+)'.*?Used (\d+) registers"
                     r"(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?", text, re.S)
spills = [l for l in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
          if l != ("0", "0")]
serialized = re.findall(r"wgmma.mma_async instructions are serialized", text)
if not entries:
    print("ptxas: no resource report found"); sys.exit(0)
regs = [int(e[2]) for e in entries]
archs = sorted({e[1] for e in entries})
print(f"ptxas: {len(entries)} kernels for {', '.join(archs)}; registers {min(regs)}..{max(regs)}; "
      f"non-zero spills: {len(spills)}; serialised wgmma: {len(serialized)}")
EOF
}

# ---- 4. ctest ----------------------------------------------------------------------------------
if [[ ${STATUS[build]} == PASS && $WITH_TESTS == ON ]]; then
  run_step ctest required 240 gtest.log ctest --test-dir "$BUILD_DIR" --output-on-failure \
    --parallel "$JOBS"
elif [[ $WITH_TESTS == OFF ]]; then
  STATUS[ctest]="SKIP (GoogleTest not available: carry .deps/googletest)"
  ROWS+=("| ctest | required | ${STATUS[ctest]} | 0 | - |")
else
  STATUS[ctest]="SKIP (build failed)"
  ROWS+=("| ctest | required | ${STATUS[ctest]} | 0 | - |")
fi

# ---- 5-9. Python-level steps (need the package) ------------------------------------------------
SANITIZE_PY='
import torch, openkda
torch.manual_seed(0)
for shape, lb, dt in [((2, 33, 4, 64), None, torch.bfloat16), ((1, 37, 3, 100), -5.0, torch.float32),
                      ((3, 5, 2, 8), -1.0, torch.float16)]:
    HV, K = shape[-2:]
    for unaligned in (False, True):
        g = torch.randn(shape, device="cuda").to(dt)
        if unaligned:
            buf = torch.empty(g.numel() + 1, dtype=dt, device="cuda"); buf[1:].copy_(g.flatten())
            g = buf[1:].view(shape)
        g.requires_grad_(True)
        A = torch.randn(HV, device="cuda", requires_grad=True)
        b = torch.randn(HV * K, device="cuda", requires_grad=True)
        y = openkda.fused_kda_gate(g, A, b, lower_bound=lb)
        y.backward(torch.randn_like(y))
# chunk_kda forward in the safe-gate serving configuration, each call with and without h
# snapshots (the fixed-format scan kernels, ScanIo, run only without).
serving = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
               use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0)
def bf16(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
def serving_calls(q, k, v, g, beta, h0, **kw):
    for want_h in (True, False):
        openkda.chunk_kda(q, k, v, g, beta, initial_state=h0,
            A_log=torch.zeros(v.shape[2], device="cuda"), return_intermediate_states=want_h,
            **serving, **kw)
# small varlen case with an initial state
cu = torch.tensor([0, 1, 70, 70, 133], dtype=torch.int32, device="cuda")
T, H, HV, K, V = 133, 2, 4, 64, 64
q, k, v, g, beta = bf16(1, T, H, K), bf16(1, T, H, K), bf16(1, T, HV, V), bf16(1, T, HV, K), \
    bf16(1, T, HV)
h0 = torch.randn(4, HV, K, V, device="cuda")
with torch.inference_mode():
    serving_calls(q, k, v, g, beta, h0, cu_seqlens=cu)
    # time split (dense, few chains, >= 32 chunks): transition, combine and output passes
    Ts = 2100
    serving_calls(bf16(1, Ts, 1, K), bf16(1, Ts, 1, K), bf16(1, Ts, 2, V), bf16(1, Ts, 2, K),
                  bf16(1, Ts, 2), torch.randn(1, 2, K, V, device="cuda"))
    # the same for one varlen sequence with padding rows: its last segment is empty
    serving_calls(bf16(1, Ts, 1, K), bf16(1, Ts, 1, K), bf16(1, Ts, 2, V), bf16(1, Ts, 2, K),
                  bf16(1, Ts, 2), torch.randn(1, 2, K, V, device="cuda"),
                  cu_seqlens=torch.tensor([37, 1500], dtype=torch.int32, device="cuda"))
    # prep / scan hand-off (dense, K = V = 128, SMs / 4 < HV <= SMs - 8, 64 chunks): the
    # persistent prep beside the scan
    Hh, Th = torch.cuda.get_device_properties(0).multi_processor_count // 2 + 1, 2048
    serving_calls(bf16(1, Th, Hh, 128), bf16(1, Th, Hh, 128), bf16(1, Th, Hh, 128),
                  bf16(1, Th, Hh, 128), bf16(1, Th, Hh),
                  torch.randn(1, Hh, 128, 128, device="cuda"))
    # decode: state pool in place, 2 tokens per sequence
    pool = torch.randn(6, HV, K, V, device="cuda")
    idx = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32, device="cuda")
    cu2 = torch.tensor([0, 2, 4], dtype=torch.int32, device="cuda")
    openkda.fused_recurrent_kda_fwd(q[:, :4], k[:, :4], v[:, :4], g[:, :4], beta[:, :4],
        A_log=torch.zeros(HV, device="cuda"), initial_state=pool, inplace_final_state=True,
        cu_seqlens=cu2, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    # decode on the streaming kernel (N * HV above the SM count): 0..2 tokens per sequence,
    # per-token states into the pool, padded (-1) slots
    N2 = torch.cuda.get_device_properties(0).multi_processor_count // HV + 2
    lens2 = torch.arange(N2, device="cuda") % 3
    cu3 = torch.cat([torch.zeros(1, device="cuda", dtype=torch.long), lens2.cumsum(0)]).int()
    T2 = int(cu3[-1])
    q2, k2 = (torch.randn(1, T2, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v2 = torch.randn(1, T2, HV, V, device="cuda", dtype=torch.bfloat16)
    g2 = torch.randn(1, T2, HV, K, device="cuda", dtype=torch.bfloat16)
    beta2 = torch.rand(1, T2, HV, device="cuda", dtype=torch.bfloat16)
    pool2 = torch.randn(2 * N2 + 1, HV, K, V, device="cuda")
    idx2 = torch.randperm(2 * N2, device="cuda")[: 2 * N2].view(N2, 2).int()
    idx2[1, 0] = -1  # sequence 1 (one token): zero initial state, its store skipped
    openkda.fused_recurrent_kda_fwd(q2, k2, v2, g2, beta2, A_log=torch.zeros(HV, device="cuda"),
        initial_state=pool2, inplace_final_state=True, cu_seqlens=cu3, ssm_state_indices=idx2,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    # no pool: final state per sequence, no initial state (zeros streamed out)
    openkda.fused_recurrent_kda(q2, k2, v2, g2, beta2, output_final_state=True, cu_seqlens=cu3,
        use_qk_l2norm_in_kernel=True)
    # device index values the host cannot check (clamped by the kernels): decreasing cu_seqlens
    # and a single-element one (N = 0) for chunk_kda; cu_seqlens past T and a sequence longer
    # than its state_indices row for the decode kernels
    for bad in ([0, 133, 0, 133], [7]):  # 6 chunks > 5 workspace slots; N = 0
        openkda.chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.tensor(bad, dtype=torch.int32, device="cuda"))
    # decreasing cu_seqlens with h, which the host sizes from them (3 or 5 rows for the 4 or 8
    # snapshots of the clamped sequences): the snapshot offsets hit their cap (h_offsets at 64)
    for cs in (32, 64):
        openkda.chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, chunk_size=cs,
            return_intermediate_states=True,
            cu_seqlens=torch.tensor([5, 120, 10, 125], dtype=torch.int32, device="cuda"))
    cu4 = torch.tensor([0, 3, 1000], dtype=torch.int32, device="cuda")
    openkda.fused_recurrent_kda_fwd(q[:, :8], k[:, :8], v[:, :8], g[:, :8], beta[:, :8],
        initial_state=pool, inplace_final_state=True, cu_seqlens=cu4, ssm_state_indices=idx,
        use_qk_l2norm_in_kernel=True)
torch.cuda.synchronize()
print("sanitizer workload done")
'
if [[ ${STATUS[build]} == PASS ]]; then
  run_step pytest required 420 pytest.log \
    bash -c "cd '$BUILD_DIR' && '$PYTHON' -m pytest '$ROOT/tests/python' -m gpu -q -rs"
  run_step checks required 180 bench.log "$PYTHON" benchmarks/bench_gate.py --check
  # shellcheck disable=SC2086
  run_step bench optional 200 bench.log "$PYTHON" benchmarks/bench_gate.py \
      --markdown --results-dir "$OUT" --summary /tmp/openkda-bench-table.md \
    ${OPENKDA_BENCH_ARGS:-}
  # shellcheck disable=SC2086
  run_step bench_chunk optional 300 bench_chunk.log "$PYTHON" benchmarks/bench_chunk_fwd.py \
      --markdown "$OUT/chunk_fwd-h200.md" --plot "$OUT/chunk_fwd-h200.png" \
    ${OPENKDA_BENCH_CHUNK_ARGS:-}
  run_step host_time optional 90 host_time.log "$PYTHON" benchmarks/host_time.py
  run_step bench_decode optional 150 bench_decode.log "$PYTHON" benchmarks/bench_decode.py \
      --markdown "$OUT/decode-h200.md"
  if command -v compute-sanitizer >/dev/null 2>&1; then
    run_step memcheck optional 150 sanitizer.log compute-sanitizer --tool memcheck \
      --kernel-name kns=openkda_ --error-exitcode 3 "$PYTHON" -c "$SANITIZE_PY"
    run_step racecheck optional 150 sanitizer.log compute-sanitizer --tool racecheck \
      --racecheck-report all --kernel-name kns=openkda_ --error-exitcode 3 \
      "$PYTHON" -c "$SANITIZE_PY"
  else
    ROWS+=("| memcheck | optional | SKIP (no compute-sanitizer) | 0 | - |")
  fi
else
  ROWS+=("| pytest, checks, bench, sanitizer | - | SKIP (build failed) | 0 | - |")
fi

# ---- summary -----------------------------------------------------------------------------------
{
  cat "$OUT/env.txt"
  echo
  echo "GoogleTest source: ${STATUS[gtest-src]:-built from $GTEST_SRC}; suite built: $WITH_TESTS"
  [[ -f "$OUT/build.log" ]] && ptxas_summary
  echo
  echo "| step | kind | status | seconds | log |"
  echo "|---|---|---|---:|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  [[ -f "$OUT/gtest.log" ]] && grep -E "tests passed|tests failed" "$OUT/gtest.log" | tail -1 \
    | sed 's/^/ctest: /'
  [[ -f "$OUT/pytest.log" ]] && grep -E "passed|failed|skipped|error|no tests ran" \
    "$OUT/pytest.log" | tail -1 | sed 's/^/pytest: /'
  echo
  if [[ -f "$OUT/bench.log" ]] && grep -q "^gate checks:" "$OUT/bench.log"; then
    echo "## gate checks"
    echo
    echo '```'
    sed -n '/^case /,/^gate checks:/p' "$OUT/bench.log"
    echo '```'
  fi
  if [[ ${STATUS[bench]:-} == PASS && -f /tmp/openkda-bench-table.md ]]; then
    echo
    echo "## benchmark (fused_kda_gate)"
    echo
    cat /tmp/openkda-bench-table.md
  fi
  for table in chunk_fwd decode; do
    if [[ -f "$OUT/$table-h200.md" ]]; then
      echo
      echo "## benchmark ($table)"
      echo
      cat "$OUT/$table-h200.md"
    fi
  done
  echo
  if [[ $REQUIRED_FAILED -eq 0 ]]; then
    echo "RESULT: PASS (required steps passed; $SECONDS s)"
  else
    echo "RESULT: FAIL (a required step failed; $SECONDS s)"
  fi
} >"$OUT/summary.md"
rm -f "$OUT/env.txt"
# FLA's autotune results for the next run to carry (OPENKDA_FLA_AUTOTUNE).
(cd "$TRITON_CACHE_DIR" 2>/dev/null \
  && find . -name '*.autotune.json' | sort >/tmp/openkda-autotune \
  && [[ -s /tmp/openkda-autotune ]] && tar czf "$OUT/fla-autotune.tgz" -T /tmp/openkda-autotune)

echo
cat "$OUT/summary.md"
exit "$REQUIRED_FAILED"
