#!/usr/bin/env bash
# The agent on a real GPU, in one command on a lent GPU machine (docs/gpu-check.md):
#
#   bash benchmarks/gpu_check.sh            on the GPU machine: install from .whl/, scrape and
#                                           check idle and under bf16 load, compare with
#                                           nvidia-smi, the NVML table, nccl-tests if carried
#   bash benchmarks/gpu_check.sh dry-run    here, against the simulator (no GPU, no torch)
#   bash benchmarks/gpu_check.sh prepare    here: the wheels and sources to carry, into .whl/
#
# Each step runs under its own time limit and the whole under GPU_CHECK_BUDGET seconds (default
# 300: the machine's start and the transfers must fit beside it in 8 minutes); a step that fails
# or runs out of time leaves the others' results. What comes back ($OUT, at most 8 files):
# summary.md (pass/fail per item), nvml-table.md, results.json and gpu-check.tar.gz (every raw
# output). The exit status is 0 when no item failed.
set -u -o pipefail

MODE=${1:-run}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHECK=$ROOT/benchmarks/gpu_check.py
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/.whl}
BUDGET=${GPU_CHECK_BUDGET:-300}
OUT=${OUT:-$ROOT/build/gpu-check}
FIXTURES=$ROOT/tests/fixtures

prepare() {
    # The wheels of every runtime requirement in pyproject's ranges for the machine's CPython 3.12
    # on x86-64 (it reaches no registry), the project's own wheel, and nccl-tests' source when
    # NCCL_TESTS_SRC names a checkout or a bare git repository of it.
    local python=${PYTHON:-$ROOT/.venv/bin/python}
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    "$python" - "$ROOT/pyproject.toml" > "$WHEELS/requirements.txt" <<'EOF'
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))
EOF
    "$python" -m pip download -q --disable-pip-version-check --only-binary=:all: \
        --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -r "$WHEELS/requirements.txt" -d "$WHEELS" || return 1
    "$python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
        -w "$WHEELS" "$ROOT" || return 1
    if [ -n "${NCCL_TESTS_SRC:-}" ]; then
        if git --git-dir="$NCCL_TESTS_SRC" rev-parse HEAD >/dev/null 2>&1; then
            git --git-dir="$NCCL_TESTS_SRC" archive --format=tar.gz --prefix=nccl-tests/ \
                -o "$WHEELS/nccl-tests.tar.gz" HEAD
        else
            tar -czf "$WHEELS/nccl-tests.tar.gz" -C "$(dirname "$NCCL_TESTS_SRC")" \
                --transform "s,^$(basename "$NCCL_TESTS_SRC"),nccl-tests," "$(basename "$NCCL_TESTS_SRC")"
        fi
    fi
    # The tree the wheel was built from: the machine may get no .git to say it.
    { git -C "$ROOT" rev-parse HEAD; git -C "$ROOT" status --short; } > "$WHEELS/source.txt"
    ls -l "$WHEELS"
    du -sh "$WHEELS"
}

case $MODE in
    prepare) prepare; exit $? ;;
    run) PYTHON=${GPU_CHECK_PYTHON:-python3} ;;
    dry-run) PYTHON=${GPU_CHECK_PYTHON:-$ROOT/.venv/bin/python} ;;
    *) echo "usage: $0 [run|dry-run|prepare]" >&2; exit 2 ;;
esac

START=$SECONDS
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
R=$WORK/results
mkdir -p "$R" "$OUT"
SITE=$WORK/site
LOAD_PID=

finish() {
    [ -n "$LOAD_PID" ] && kill "$LOAD_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap finish EXIT

# step NAME LIMIT COMMAND...: runs it with its output in $R/NAME.log (stderr in NAME.err), under
# the smaller of its limit and what is left of the budget; its exit status, time and note go to
# steps.tsv.
step() {
    local name=$1 limit=$2 left rc began
    shift 2
    left=$((BUDGET - (SECONDS - START)))
    if [ "$left" -lt 15 ]; then
        printf '%s\tskipped\t0\tthe budget (%ss) was spent\n' "$name" "$BUDGET" >> "$R/steps.tsv"
        return 99
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    began=$SECONDS
    timeout -k 5 "$limit" "$@" > "$R/$name.log" 2> "$R/$name.err"
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - began))" "${NOTE:-}" >> "$R/steps.tsv"
    NOTE=
    echo "[$((SECONDS - START))s] $name: exit $rc"
    return $rc
}
skip() { printf '%s\tskipped\t0\t%s\n' "$1" "$2" >> "$R/steps.tsv"; echo "$1: skipped: $2"; }

# nvidia-smi -q -x, or in the dry run the capture it stands in for; within the budget.
smi() {
    local left=$((BUDGET - (SECONDS - START)))
    if [ "$MODE" = dry-run ]; then
        cp "${GPU_CHECK_SMI_XML:-$FIXTURES/nvidia-smi/a100-sxm4-80gb-535.xml}" "$R/smi-$1.xml"
    elif [ "$left" -gt 5 ]; then
        timeout "$((left < 30 ? left : 30))" nvidia-smi -q -x > "$R/smi-$1.xml" 2> "$R/smi-$1.err"
        # The same in the form people read, once per phase (the comparisons use the XML).
        case $1 in *-before) timeout "$((left < 30 ? left : 30))" nvidia-smi -q > "$R/smi-$1.txt" 2>> "$R/smi-$1.err" ;; esac
    fi
}

{
    echo "mode: $MODE"
    date -u +%FT%TZ
    uname -a
    "$PYTHON" --version
    git -C "$ROOT" rev-parse HEAD 2>/dev/null
    git -C "$ROOT" status --short 2>/dev/null | head -20
    ls -l "$WHEELS" 2>/dev/null
    cat "$WHEELS/source.txt" 2>/dev/null
    if [ "$MODE" = run ]; then
        timeout 10 nvidia-smi -L
        timeout 10 nvidia-smi --version
        command -v nvcc && timeout 10 nvcc --version | tail -2
        timeout 30 "$PYTHON" -m pip list 2>/dev/null \
            | grep -i -E '^(torch|nvidia-ml-py|nvidia-nccl|prometheus.client|psutil|pyyaml|grpcio|protobuf|h11|packaging) '
    fi
} > "$R/environment.txt" 2>&1

if [ "$MODE" = dry-run ] && ! ls "$WHEELS"/clusterhealth-*.whl >/dev/null 2>&1; then
    # Here the requirements are already in the virtualenv: the project's wheel is all to carry.
    mkdir -p "$WHEELS"
    # Offline with the virtualenv's setuptools; where it is too old, in pip's own build environment.
    step wheel 120 "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
        -w "$WHEELS" "$ROOT" \
        || step wheel-isolated 180 "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps \
            -w "$WHEELS" "$ROOT"
fi
step install 90 "$PYTHON" "$CHECK" install --wheels "$WHEELS" --target "$SITE" --report "$R/install.json"
export PYTHONPATH=$SITE
CH=("$PYTHON" "$SITE/bin/clusterhealth")
COMMON=(--node-name gpu-check)

# The H200-like simulated GPU: in the dry run it is the GPU; in the real run it is the reference
# for which series the agent should export (built from the real GPU's own nvidia-smi).
if [ "$MODE" = dry-run ]; then
    SCENARIO_XML=${GPU_CHECK_SCENARIO_XML:-${GPU_CHECK_SMI_XML:-$FIXTURES/nvidia-smi/a100-sxm4-80gb-535.xml}}
else
    smi reference
    SCENARIO_XML=$R/smi-reference.xml
fi
step scenario 30 "$PYTHON" "$CHECK" scenario --smi-xml "$SCENARIO_XML" --idle "$R/scenario-idle.yaml" \
    --busy "$R/scenario-busy.yaml"

phase() {  # phase NAME [scrape options...]: nvidia-smi, scrape, nvidia-smi, check, NVML table
    local name=$1
    shift
    smi "$name-before"
    step "scrape-$name" 60 "${CH[@]}" scrape "${COMMON[@]}" "$@" && cp "$R/scrape-$name.log" "$R/scrape-$name.prom"
    smi "$name-after"
    step "check-$name" 60 "${CH[@]}" check --json "${COMMON[@]}" "$@"
    # check exits 0-3 by the health it finds; its JSON is the result.
    cp "$R/check-$name.log" "$R/check-$name.json"
    step "nvml-$name" 90 "$PYTHON" "$CHECK" nvml-table --phase "$name" --out "$R/nvml-$name.json" -- \
        "${COMMON[@]}" "$@"
}

if [ "$MODE" = dry-run ]; then
    phase idle --simulate "$R/scenario-idle.yaml"
    # No torch here: the load is the simulator's busy GPU, scraped once (check and the NVML table
    # under load run the same code as idle); nvidia-smi has no reading of it.
    NOTE="dry run: the simulator's busy GPU stands in for bf16 load" step scrape-load 60 \
        "${CH[@]}" scrape "${COMMON[@]}" --simulate "$R/scenario-busy.yaml" && cp "$R/scrape-load.log" "$R/scrape-load.prom"
    # The idle GPU is the simulated H200 already.
    cp "$R/scrape-idle.prom" "$R/scrape-reference.prom" 2>/dev/null
    skip scrape-reference "dry run: the idle scrape is the simulator's"
else
    phase idle
    # The load: bf16 matrix products in the machine's own python (torch), without the carried
    # packages on its path; measured once it has warmed up.
    env -u PYTHONPATH timeout 150 "$PYTHON" "$CHECK" load --seconds 60 --ready "$R/load-ready.json" \
        --report "$R/load.json" > "$R/load.log" 2>&1 &
    LOAD_PID=$! LOAD_START=$SECONDS
    for _ in $(seq 1 90); do
        [ -s "$R/load-ready.json" ] || ! kill -0 "$LOAD_PID" 2>/dev/null && break
        sleep 1
    done
    if [ -s "$R/load-ready.json" ]; then
        sleep 3
        phase load
    else
        skip load-phase "the bf16 load did not start (load.log)"
    fi
    kill "$LOAD_PID" 2>/dev/null
    wait "$LOAD_PID" 2>/dev/null
    printf 'load\t%s\t%s\tbf16 matrix products in the background, stopped after the load phase\n' \
        "$([ -s "$R/load-ready.json" ] && echo ran || echo failed)" "$((SECONDS - LOAD_START))" >> "$R/steps.tsv"
    LOAD_PID=
    step scrape-reference 60 "${CH[@]}" scrape "${COMMON[@]}" --simulate "$R/scenario-idle.yaml" \
        && cp "$R/scrape-reference.log" "$R/scrape-reference.prom"
fi

# nccl-tests on the one GPU, through `probe parse`: built here from the carried source against
# the NCCL of the machine's python (nvidia-nccl-cu13), for Hopper only (one gencode keeps it short).
nccl() {
    local src=$WHEELS/nccl-tests.tar.gz home build nvcc nccl
    if [ "$MODE" = dry-run ]; then
        # No nvcc here: the capture of a single-node run stands in for the output.
        cp "${GPU_CHECK_NCCL_SAMPLE:-$FIXTURES/nccl-tests/08_single_node_8x_h100_allreduce.txt}" "$R/nccl-all_reduce.txt"
        step nccl-parse-all_reduce 30 "${CH[@]}" probe parse --kind nccl-tests "$R/nccl-all_reduce.txt"
        cp "$R/nccl-parse-all_reduce.log" "$R/nccl-all_reduce.json"
        return
    fi
    [ -f "$src" ] || { skip nccl-tests "no nccl-tests source carried (.whl/nccl-tests.tar.gz)"; return; }
    nvcc=$(command -v nvcc) || { skip nccl-tests "no nvcc"; return; }
    nccl=$(env -u PYTHONPATH "$PYTHON" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
    [ -f "$nccl/include/nccl.h" ] || { skip nccl-tests "no nccl.h in the machine's nvidia-nccl ($nccl)"; return; }
    [ $((BUDGET - (SECONDS - START))) -gt 120 ] || { skip nccl-tests "too little of the budget left"; return; }
    home=$WORK/nccl-home build=$WORK/nccl-tests
    mkdir -p "$home/lib" "$build"
    ln -s "$nccl/include" "$home/include"
    ln -s "$(ls "$nccl"/lib/libnccl.so* | head -1)" "$home/lib/libnccl.so"
    tar -xzf "$src" -C "$build"
    step nccl-build 150 make -C "$build/nccl-tests/src" -j16 BUILDDIR="$build/out" NCCL_HOME="$home" \
        CUDA_HOME="$(dirname "$(dirname "$nvcc")")" NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90 \
        "$build/out/all_reduce_perf" "$build/out/sendrecv_perf" || return
    for kind in all_reduce sendrecv; do
        LD_LIBRARY_PATH=$nccl/lib:${LD_LIBRARY_PATH:-} step "nccl-$kind" 60 \
            "$build/out/${kind}_perf" -b 8 -e 256M -f 4 -g 1 -c 1 \
            && cp "$R/nccl-$kind.log" "$R/nccl-$kind.txt"
        [ -f "$R/nccl-$kind.txt" ] || continue
        step "nccl-parse-$kind" 30 "${CH[@]}" probe parse --kind nccl-tests "$R/nccl-$kind.txt"
        cp "$R/nccl-parse-$kind.log" "$R/nccl-$kind.json"
    done
}
nccl

timeout 60 "$PYTHON" "$CHECK" analyze --dir "$R" --mode "$([ "$MODE" = run ] && echo real || echo dry-run)" > "$R/analyze.log" 2>&1
status=$?
if [ ! -s "$R/summary.md" ]; then
    # The analysis itself failed: the steps' exit codes are all there is to say.
    { echo "# GPU check: summary"; echo; echo "The analysis failed (analyze.log):"; echo '```';
      tail -20 "$R/analyze.log"; echo '```'; echo; echo '```'; cat "$R/steps.tsv"; echo '```'; } > "$R/summary.md"
    status=1
fi
echo "total: $((SECONDS - START)) s" >> "$R/summary.md"
cp "$R/summary.md" "$R/results.json" "$R/nvml-table.md" "$OUT/" 2>/dev/null
tar -czf "$OUT/gpu-check.tar.gz" -C "$WORK" results
cat "$R/summary.md"
exit $status
