#!/bin/sh
# bench/run.sh - time mnistcu against PyTorch on the configurations of BENCHMARKS.md.
#
#   sh bench/run.sh          GPU (what `make bench` runs): P1, P2, P3 with mnistcu (own kernels and
#                            cuBLAS), PyTorch eager and PyTorch with the step in a CUDA graph, each
#                            in its own process; then bench/cuda_gemm.cu. Needs nvcc, a GPU, PyTorch.
#   sh bench/run.sh cpu      P7 on the CPU: mnistcu with 1 and 2 threads, PyTorch CPU eager if importable.
#
# Knobs (environment): CUDA_ARCH (default 90), NVCC, CC, PYTHON (a python with torch), DATA (default
# data/mnist), EPOCHS (timed epochs of P2/P3/P7, default 6; P1 always runs its 10),
# TORCH_CPU_EPOCHS (PyTorch's timed P7 epochs, default 5), OUT (a folder to copy the results to).
# Results: bench/out/results.jsonl (one JSON line per run), bench/out/run.log (everything printed).
# Exits non-zero, after printing what it could, when any build or run failed.
# POSIX sh (dash): no bashisms.

set -u
cd "$(dirname "$0")/.." || exit 1

MODE=${1:-gpu}
case $MODE in gpu|cpu) ;; *) echo "usage: sh bench/run.sh [gpu|cpu]" >&2; exit 2 ;; esac

OUTDIR=bench/out
RES=$OUTDIR/results.jsonl
LOG=$OUTDIR/run.log
STATUS=$OUTDIR/.status
mkdir -p "$OUTDIR" build || exit 1
: > "$RES"
rm -f "$OUTDIR/cuda_gemm.txt"
echo 0 > "$STATUS"
CUDA_ARCH=${CUDA_ARCH:-90}
EPOCHS=${EPOCHS:-6}
TORCH_CPU_EPOCHS=${TORCH_CPU_EPOCHS:-5}
DATA=${DATA:-data/mnist}

failed() {
    echo "*** FAILED: $* ***" >&2
    echo 1 > "$STATUS"
}

# run_json DESCRIPTION COMMAND...: run one benchmark process, append its JSON line to the results
run_json() {
    rj_desc=$1; shift
    echo "---- $rj_desc: $*" >&2
    "$@" > "$OUTDIR/.stdout"
    rj_rc=$?
    if [ "$rj_rc" -ne 0 ]; then
        failed "$rj_desc (exit $rj_rc)"
        return 1
    fi
    if ! grep '^{' "$OUTDIR/.stdout" > "$OUTDIR/.json" || [ ! -s "$OUTDIR/.json" ]; then
        failed "$rj_desc printed no JSON line"
        return 1
    fi
    cat "$OUTDIR/.json" >> "$RES"
    cat "$OUTDIR/.json" >&2
    return 0
}

find_nvcc() {
    if [ -n "${NVCC:-}" ]; then echo "$NVCC"
    elif command -v nvcc > /dev/null 2>&1; then command -v nvcc
    elif [ -x /usr/local/cuda/bin/nvcc ]; then echo /usr/local/cuda/bin/nvcc
    fi
}

# a python that imports torch: $PYTHON, python3, /usr/bin/python3, python
find_python() {
    for fp in ${PYTHON:-} python3 /usr/bin/python3 python; do
        if command -v "$fp" > /dev/null 2>&1 && "$fp" -c 'import torch' > /dev/null 2>&1; then
            echo "$fp"; return 0
        fi
    done
    return 1
}

find_data() {
    for fd in "$DATA" data/mnist ../shared/datasets/mnist shared/datasets/mnist; do
        if [ -f "$fd/train-images-idx3-ubyte.gz" ] && [ -f "$fd/train-labels-idx1-ubyte.gz" ] &&
           [ -f "$fd/t10k-images-idx3-ubyte.gz" ] && [ -f "$fd/t10k-labels-idx1-ubyte.gz" ]; then
            echo "$fd"; return 0
        fi
    done
    return 1
}

# the final table, from results.jsonl (plain python3, no torch needed)
table() {
    tb_py=$1
    "$tb_py" - "$RES" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def t(r):  # P1: total seconds of its 10 epochs; else the median ms per epoch
    return r["total_s"] if r["config"] == "P1" else r["epoch_ms_median"]
def label(r):
    if r["impl"] == "mnistcu":
        return "mnistcu " + (r["gemm"] if r["device"] == "cuda" else "cpu %dt" % r["threads"])
    return r["impl"] + ("" if r["device"] == "cuda" else " cpu %st" % r.get("threads"))
print("| config | impl | time | test acc | train loss | time / mnistcu best |")
print("|---|---|---|---|---|---|")
for cfg in sorted(set(r["config"] for r in rows)):
    rs = [r for r in rows if r["config"] == cfg]
    ours = [t(r) for r in rs if r["impl"] == "mnistcu"]
    best = min(ours) if ours else None
    for r in rs:
        unit = "%.4f s total" % t(r) if cfg == "P1" else "%.3f ms/epoch" % t(r)
        ratio = "%.2fx" % (t(r) / best) if best else "n/a (no mnistcu result)"
        print("| %s | %s | %s | %.2f%% | %.4f | %s |" % (cfg, label(r), unit, 100 * r["test_accuracy"],
                                                       r["train_loss"], ratio))
EOF
}

main() {
    echo "== mnistcu benchmarks ($MODE)"
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "host: $(uname -srm), $(nproc 2>/dev/null || echo '?') cores"
    if command -v nvidia-smi > /dev/null 2>&1; then
        echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1)"
    else
        echo "gpu: none (no nvidia-smi)"
    fi
    NVCCBIN=$(find_nvcc)
    if [ -n "$NVCCBIN" ]; then echo "nvcc: $("$NVCCBIN" --version | grep -i release | head -n 1)"; else echo "nvcc: none"; fi
    PY=$(find_python) || PY=
    if [ -n "$PY" ]; then
        echo "torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)') ($PY)"
    else
        echo "torch: not importable (tried \$PYTHON, python3, /usr/bin/python3, python)"
    fi
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (working tree modified)')"
    D=$(find_data) || { failed "MNIST not found in $DATA (nor data/mnist, ../shared/datasets/mnist): run sh data/fetch.sh mnist or set DATA"; return; }
    echo "data: $D"

    if [ "$MODE" = cpu ]; then
        CCBIN=${CC:-cc}
        echo "---- build: $CCBIN -std=c99 -O3 -march=native -fopenmp -o build/bench_cpu bench/bench.c -lm" >&2
        if $CCBIN -std=c99 -O3 -march=native -fopenmp -o build/bench_cpu bench/bench.c -lm; then
            run_json "mnistcu P7 cpu 1 thread" build/bench_cpu P7 --threads 1 --epochs "$EPOCHS" --data "$D"
            run_json "mnistcu P7 cpu 2 threads" build/bench_cpu P7 --threads 2 --epochs "$EPOCHS" --data "$D"
        else
            failed "building build/bench_cpu"
        fi
        if [ -n "$PY" ]; then
            run_json "torch-eager P7 cpu" "$PY" bench/torch_bench.py P7 --device cpu --epochs "$TORCH_CPU_EPOCHS" --data "$D"
        else
            echo "(PyTorch not importable: PyTorch CPU skipped)"
        fi
    else
        if [ -z "$NVCCBIN" ]; then failed "nvcc not found (set NVCC); for the CPU run use: sh bench/run.sh cpu"; return; fi
        if ! nvidia-smi -L > /dev/null 2>&1; then failed "no GPU (nvidia-smi -L fails); for the CPU run use: sh bench/run.sh cpu"; return; fi
        if [ -z "$PY" ]; then failed "PyTorch not importable: the PyTorch side will be missing"; fi
        echo "---- build: $NVCCBIN -x cu -O3 -arch=sm_$CUDA_ARCH -DMNISTCU_CUBLAS -o build/bench_cuda bench/bench.c -lcublas" >&2
        if "$NVCCBIN" -x cu -O3 -arch=sm_"$CUDA_ARCH" -DMNISTCU_CUBLAS -o build/bench_cuda bench/bench.c -lcublas; then
            HAVE_BENCH=1
        else
            failed "building build/bench_cuda"; HAVE_BENCH=0
        fi
        for C in P1 P2 P3; do
            if [ "$C" = P1 ]; then EP=10; else EP=$EPOCHS; fi
            if [ "$HAVE_BENCH" = 1 ]; then
                run_json "mnistcu $C own" build/bench_cuda "$C" --device cuda --gemm own --epochs "$EP" --data "$D"
                run_json "mnistcu $C cublas" build/bench_cuda "$C" --device cuda --gemm cublas --epochs "$EP" --data "$D"
            fi
            if [ -n "$PY" ]; then
                run_json "torch-eager $C" "$PY" bench/torch_bench.py "$C" --device cuda --mode eager --epochs "$EP" --data "$D"
                run_json "torch-graph $C" "$PY" bench/torch_bench.py "$C" --device cuda --mode graph --epochs "$EP" --data "$D"
            fi
        done
    fi

    echo
    echo "== results ($RES)"
    if [ -s "$RES" ]; then
        TPY=${PY:-$(command -v python3 || echo /usr/bin/python3)}
        table "$TPY" || failed "printing the table"
    else
        echo "(no results)"
    fi
    echo "time: P1 = total seconds of 10 epochs; others = median ms per epoch. Last column: this time over mnistcu's best time for the config (torch rows: mnistcu's speed-up)."

    if [ "$MODE" = gpu ]; then
        echo
        echo "== matrix-product kernels (bench/cuda_gemm.cu)"
        echo "---- build: $NVCCBIN -O3 -arch=sm_$CUDA_ARCH bench/cuda_gemm.cu -o build/cuda_gemm -lcublas" >&2
        if "$NVCCBIN" -O3 -arch=sm_"$CUDA_ARCH" bench/cuda_gemm.cu -o build/cuda_gemm -lcublas; then
            build/cuda_gemm > "$OUTDIR/cuda_gemm.txt" || failed "build/cuda_gemm"
            cat "$OUTDIR/cuda_gemm.txt"
        else
            failed "building build/cuda_gemm"
        fi
    fi
}

main 2>&1 | tee "$LOG"
RC=$(cat "$STATUS")
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT" && cp "$RES" "$LOG" "$OUT"/ && { [ ! -f "$OUTDIR/cuda_gemm.txt" ] || cp "$OUTDIR/cuda_gemm.txt" "$OUT"/; }
fi
if [ "$RC" != 0 ]; then
    echo "bench/run.sh: SOME STEPS FAILED (see above and $LOG)" >&2
    exit 1
fi
echo "bench/run.sh: done; results in $RES and $LOG"
