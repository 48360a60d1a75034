#!/bin/sh
# bench/run.sh - time mnistcu against PyTorch and JAX on the configurations of BENCHMARKS.md.
#
#   sh bench/run.sh          GPU (what `make bench` runs): P1, P2, P3 (MLPs), P4 (LeNet-5) and P5 (the
#                            Fashion-MNIST CNN) with mnistcu (own kernels; cuBLAS when the build has it;
#                            for P4/P5 also cuBLAS + cuDNN when cuDNN is found; P4 also in the opt-in
#                            fused LeNet-5 kernel, --fused-cnn on, on a GPU of compute capability 9) and
#                            the peers of PEERS:
#                            PyTorch eager, PyTorch with the step captured in a CUDA graph (P4/P5 also
#                            with cudnn.benchmark on), PyTorch with the step through torch.compile
#                            (max-autotune kernels) captured in a CUDA graph (torch_bench.py --mode
#                            compile), JAX with each epoch one jitted lax.scan (bench/jax_bench.py), each
#                            in its own process; P6 (time to 99.0% test accuracy, mnistcu's recipe in
#                            bench.c with our convolutions and cuBLAS's dense products where built with
#                            it, once per seed of P6_SEEDS, no peer rows); then the kernel programs
#                            bench/cuda_gemm.cu and bench/cuda_conv.cu. Needs nvcc, a GPU, PyTorch (2.x
#                            for compile), JAX.
#                            A peer that fails (not importable, a compile error, killed) is a FAILED row
#                            of the summary, with its reason, and the run goes on (and exits 1 at the end).
#   sh bench/run.sh cpu      On the CPU: P7 with mnistcu on 1 and 2 threads and PyTorch CPU eager; then
#                            LeNet-5 (P4's model and hyperparameters) for one timed epoch with mnistcu and
#                            PyTorch (Debian's 1.13 through /usr/bin/python3 here), each on 1 and 2 threads.
#
# Knobs (environment):
#   CONFIGS          GPU configurations to run (default "P1 P2 P3 P4 P5 P6"; P6 is mnistcu alone, see P6_SEEDS)
#   P6_SEEDS         the seeds P6 runs with, one run each (default "1 2 3 4 5 6 7 8 9 10")
#   PEERS            the GPU peers run next to mnistcu (default "eager graph compile jax"; "" for none):
#                    eager = torch-eager, graph = torch-graph (and torch-graph+cudnn-benchmark, CUDNN_BENCH),
#                    compile = torch-compile, jax = jax-scan; e.g. PEERS="graph jax" skips the others
#   JAX_PYTHON       the python that runs bench/jax_bench.py (default: the first of $JAX_PYTHON, PyTorch's
#                    python, python3, /usr/bin/python3, python that imports jax)
#   EPOCHS           timed epochs of P2/P3/P7 (default 6; P1 always runs its 10)
#   CNN_EPOCHS       timed epochs of P4/P5 on the GPU (default 3), after one warm-up epoch
#   CUDNN_BENCH      1 (default): P4/P5 also with PyTorch graph + cudnn.benchmark; 0: not
#   PRECISIONS       reduced-precision mnistcu rows (default "tf32 bf16 tf32x3"; "" for none): each
#                    configuration again with --precision P, own kernels and cuBLAS, reported beside
#                    FP32 (speed and test accuracy against the same path), never as mnistcu's best;
#                    none when CUDA_ARCH is below 80 (no tensor cores)
#   KERNELS          kernel programs after the configurations (default "gemm conv"; "" for none)
#   PREBUILT         1: use build/bench_cuda as it is (built by an earlier run, or by hand as in
#                    bench/bench.c's header), its cuBLAS and cuDNN rows as `build/bench_cuda --build-info`
#                    says; default 0: build it
#   TORCH_CPU_EPOCHS PyTorch's timed P7 epochs (default 5)
#   CPU_CNN_EPOCHS   timed epochs of the CPU LeNet-5 rows (default 1)
#   CPU_CNN_LIMIT    training images of the CPU LeNet-5 rows (default 0: all 60,000; a full epoch took
#                    8.6-11.4 s in Debian's PyTorch 1.13 on the 2-core machine, so no limit is needed)
#   CPU_CNN_WARMUP   images of the CPU LeNet-5 rows' warm-up epoch (default 6400: 100 steps)
#   BENCH_TIMEOUT    seconds one benchmark process may run (default 600) before it is killed and failed
#   CUDA_ARCH (default 90, built as sm_90a), NVCC, CC, PYTHON (a python with torch), DATA (default data/mnist),
#   FASHION_DATA (default data/fashion-mnist; ../shared/datasets/* are tried too), CUDNN_DIR (a folder
#   with include/cudnn.h and lib/ or lib64/ holding libcudnn.so.9; default as the Makefile: nvcc's
#   CUDA, /usr/local/cuda, /usr, then the nvidia-cudnn wheel of PyTorch's python; CUDNN_DIR=none: no
#   cuDNN), OUT (a folder to copy the results to).
# Results: bench/out/results.jsonl (one JSON line per run; a failed peer's line has "failed": true and
# its "reason"), bench/out/run.log (everything printed),
# bench/out/summary.md (the summary printed last), bench/out/cuda_gemm.txt, bench/out/cuda_conv.txt.
# Exits non-zero, after printing what it could, when any build or run failed, a kernel variant was
# wrong, or a test accuracy fell below its floor (P1 85%, P2 95%, P3 90%, P4 95%, P5 85%, P7 93%).
# POSIX sh (dash): no bashisms.

set -u
cd "$(dirname "$0")/.." || exit 1

MODE=${1:-gpu}
case $MODE in gpu|cpu) ;; *) echo "usage: sh bench/run.sh [gpu|cpu]" >&2; exit 2 ;; esac

OUTDIR=bench/out
RES=$OUTDIR/results.jsonl
LOG=$OUTDIR/run.log
SUMMARY=$OUTDIR/summary.md
STATUS=$OUTDIR/.status
mkdir -p "$OUTDIR" build || exit 1
: > "$RES"
rm -f "$OUTDIR/cuda_gemm.txt" "$OUTDIR/cuda_conv.txt" "$SUMMARY"
echo 0 > "$STATUS"
CUDA_ARCH=${CUDA_ARCH:-90}
CONFIGS=${CONFIGS:-P1 P2 P3 P4 P5 P6}
# the GPU's compute capability, major (the fused LeNet-5 kernel needs 9); 0 when unknown
GPU_CC_MAJOR=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | cut -d. -f1)
# sm_90 built as sm_90a on an sm_90 GPU (as the Makefile does): Hopper's warp-group products, which
# --precision tf32x3 uses; sm_90a's code runs there only, so elsewhere sm_90 (its PTX compiles for newer GPUs)
CUDA_SM=$CUDA_ARCH
[ "$CUDA_ARCH" = 90 ] && [ "$GPU_CC_MAJOR" = 9 ] && CUDA_SM=90a
case $GPU_CC_MAJOR in ''|*[!0-9]*) GPU_CC_MAJOR=0 ;; esac
P6_SEEDS=${P6_SEEDS:-1 2 3 4 5 6 7 8 9 10}
EPOCHS=${EPOCHS:-6}
CNN_EPOCHS=${CNN_EPOCHS:-3}
CUDNN_BENCH=${CUDNN_BENCH:-1}
PRECISIONS=${PRECISIONS-tf32 bf16 tf32x3}
KERNELS=${KERNELS-gemm conv}
PREBUILT=${PREBUILT:-0}
PEERS=$(echo ${PEERS-eager graph compile jax})
TORCH_CPU_EPOCHS=${TORCH_CPU_EPOCHS:-5}
CPU_CNN_EPOCHS=${CPU_CNN_EPOCHS:-1}
CPU_CNN_LIMIT=${CPU_CNN_LIMIT:-0}
CPU_CNN_WARMUP=${CPU_CNN_WARMUP:-6400}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-600}
DATA=${DATA:-data/mnist}
FASHION_DATA=${FASHION_DATA:-data/fashion-mnist}
T_START=$(date +%s)
if command -v timeout > /dev/null 2>&1; then TIMEOUT_BIN=timeout; else TIMEOUT_BIN=; fi

failed() {
    echo "*** FAILED: $* ***" >&2
    echo 1 > "$STATUS"
}

# run_json DESCRIPTION COMMAND...: run one benchmark process (at most BENCH_TIMEOUT seconds),
# append its JSON line to the results. A process that fails may still print its failed row (a JSON
# line with "failed": true and the "reason"): that row is kept. Sets RJ_ROW (1: a row was appended)
# and RJ_WHY (why it failed).
run_json() {
    rj_desc=$1; shift
    echo "---- $rj_desc: $*" >&2
    RJ_ROW=0; RJ_WHY=
    if [ -n "$TIMEOUT_BIN" ]; then
        "$TIMEOUT_BIN" -k 10 "$BENCH_TIMEOUT" "$@" > "$OUTDIR/.stdout"
    else
        "$@" > "$OUTDIR/.stdout"
    fi
    rj_rc=$?
    if [ "$rj_rc" -eq 0 ]; then
        if grep '^{' "$OUTDIR/.stdout" > "$OUTDIR/.json" && [ -s "$OUTDIR/.json" ]; then
            cat "$OUTDIR/.json" >> "$RES"
            cat "$OUTDIR/.json" >&2
            RJ_ROW=1
            return 0
        fi
        RJ_WHY="printed no JSON line"
    elif [ "$rj_rc" -eq 124 ] || [ "$rj_rc" -eq 137 ]; then
        RJ_WHY="killed after BENCH_TIMEOUT=$BENCH_TIMEOUT s"
    else
        RJ_WHY="exit $rj_rc"
        if grep '^{.*"failed": *true' "$OUTDIR/.stdout" > "$OUTDIR/.json" && [ -s "$OUTDIR/.json" ]; then
            cat "$OUTDIR/.json" >> "$RES"
            cat "$OUTDIR/.json" >&2
            RJ_ROW=1
        fi
    fi
    failed "$rj_desc ($RJ_WHY)"
    return 1
}

# run_peer IMPL CONFIG DESCRIPTION COMMAND...: run_json for a peer (PyTorch, JAX); when it fails without
# printing its own failed row (killed, crashed), write one for it, so that the summary shows the failure
run_peer() {
    rp_impl=$1; rp_cfg=$2; shift 2
    run_json "$@" && return 0
    [ "$RJ_ROW" = 1 ] || fail_row "$rp_impl" "$rp_cfg" "$RJ_WHY (see $LOG)"
    return 1
}

# fail_row IMPL CONFIG REASON: a failed row for the summary (REASON without double quotes or backslashes)
fail_row() {
    echo "{\"impl\": \"$1\", \"config\": \"$2\", \"device\": \"cuda\", \"failed\": true, \"reason\": \"$3\"}" >> "$RES"
}

# has_peer NAME: is NAME one of PEERS
has_peer() {
    case " $PEERS " in *" $1 "*) return 0 ;; esac
    return 1
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

# a python that imports jax: $JAX_PYTHON, PyTorch's python ($PY), python3, /usr/bin/python3, python
find_jax_python() {
    for fp in ${JAX_PYTHON:-} ${PY:-} python3 /usr/bin/python3 python; do
        if command -v "$fp" > /dev/null 2>&1 && "$fp" -c 'import jax' > /dev/null 2>&1; then
            echo "$fp"; return 0
        fi
    done
    return 1
}

# find_cudnn: a folder with include/cudnn.h and libcudnn.so.9 under lib/ or lib64/ (as the Makefile looks)
find_cudnn() {
    if [ -n "${CUDNN_DIR:-}" ]; then
        [ "$CUDNN_DIR" != none ] && echo "$CUDNN_DIR"
        return 0
    fi
    fc_py=
    [ -z "$PY" ] || fc_py=$("$PY" -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])' 2> /dev/null) || fc_py=
    for fc in "${NVCCBIN%/bin/nvcc}" /usr/local/cuda /usr "$fc_py"; do
        if [ -z "$fc" ] || [ ! -f "$fc/include/cudnn.h" ]; then continue; fi
        if [ -e "$fc/lib/libcudnn.so.9" ] || [ -e "$fc/lib64/libcudnn.so.9" ] ||
           [ -e "$fc/lib/x86_64-linux-gnu/libcudnn.so.9" ]; then
            echo "$fc"; return 0
        fi
    done
    return 0
}

# cudnn_flags DEFINE: the nvcc flags that build with the cuDNN in $CUDNN (empty when none)
cudnn_flags() {
    [ -n "$CUDNN" ] || return 0
    cf=
    for cf_lib in "$CUDNN/lib" "$CUDNN/lib64" "$CUDNN/lib/x86_64-linux-gnu"; do
        [ -d "$cf_lib" ] && cf="$cf -L$cf_lib -Xlinker -rpath -Xlinker $cf_lib"
    done
    echo "-D$1 -I$CUDNN/include$cf -l:libcudnn.so.9"
}

# find_dataset FIRST_CHOICE NAME: a folder with the four gzip IDX files
find_dataset() {
    for fd in "$1" "data/$2" "../shared/datasets/$2" "shared/datasets/$2"; do
        if [ -f "$fd/train-images-idx3-ubyte.gz" ] && [ -f "$fd/train-labels-idx1-ubyte.gz" ] &&
           [ -f "$fd/t10k-images-idx3-ubyte.gz" ] && [ -f "$fd/t10k-labels-idx1-ubyte.gz" ]; then
            echo "$fd"; return 0
        fi
    done
    return 1
}

# the results table and the comparisons, from results.jsonl (plain python3, no torch needed);
# exits 3 when a test accuracy is below its configuration's floor
table() {
    tb_py=$1
    "$tb_py" - "$RES" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
p6 = [r for r in rows if r.get("config") == "P6"]  # time to accuracy: its own summary, below
rows = [r for r in rows if r.get("config") != "P6"]
FULL = {"P1": 10000}                      # training images of a complete run (others: 60,000)
FLOOR = {"P1": 0.85, "P2": 0.95, "P3": 0.90, "P4": 0.95, "P5": 0.85, "P7": 0.93}
def t(r):  # P1: total seconds of its 10 epochs; else the median ms per epoch
    return r["total_s"] if r["config"] == "P1" else r["epoch_ms_median"]
def unit(r):
    return "%.4f s total" % t(r) if r["config"] == "P1" else "%.3f ms/epoch" % t(r)
def label(r):
    if r["impl"] == "mnistcu" and not r.get("failed"):
        if r["device"] != "cuda":
            return "mnistcu cpu %dt" % r["threads"]
        conv = r["config"] in ("P4", "P5") or r.get("model") in ("lenet5", "fashion-cnn")
        return ("mnistcu " + r["gemm"] + ("+cudnn" if conv and r.get("cnn") == "cudnn" else "")
                + (" fused-cnn" if r.get("fused_cnn_steps") else " fused-clusters" if r.get("fused_cluster_steps")
                   else " fused" if r.get("fused_steps") else "")
                + ("" if fp32(r) else " " + r["precision"]))
    return r["impl"] + ("" if r["device"] == "cuda" else " cpu %st" % r.get("threads"))
def fp32(r):  # the reference precision; TF32, BF16 and TF32X3 rows are reported beside it, not counted as mnistcu's best
    return r.get("precision", "fp32") == "fp32"
def epochs(r):
    n, w = r.get("train_images", 0), r.get("warmup_images", r.get("train_images", 0))
    return "%s+%d" % ("1" if w == n or not n else "%.2f" % (w / float(n)), r["epochs"])
def key(r):  # a failed row that does not know its image count goes with the complete run
    return (r["config"], r.get("device", "cuda"), r.get("train_images") or FULL.get(r["config"], 60000))
def reason(r):
    return " ".join(str(r.get("reason", "no reason given")).replace("|", "/").split())[:300]
def gname(k):
    cfg, dev, n = k
    return cfg + ("" if dev == "cuda" else " cpu") + ("" if n == FULL.get(cfg, 60000) else " (%d imgs)" % n)
groups = sorted(set(key(r) for r in rows))
bad, notes = [], []
print("| config | impl | time | test acc | train loss | epochs (warm-up+timed) | time / mnistcu best |")
print("|---|---|---|---|---|---|---|")
for k in groups:
    rs = [r for r in rows if key(r) == k]
    ours = [t(r) for r in rs if r["impl"] == "mnistcu" and not r.get("failed") and fp32(r)]
    best = min(ours) if ours else None
    complete = k[2] >= FULL.get(k[0], 60000)
    for r in rs:
        if r.get("failed"):
            print("| %s | %s | FAILED: %s | – | – | – | – |" % (gname(k), label(r), reason(r)))
            continue
        ratio = "%.2fx" % (t(r) / best) if best else "n/a (no mnistcu result)"
        flag = ""
        if complete and not r.get("smoke") and k[0] in FLOOR and not (r["test_accuracy"] >= FLOOR[k[0]]):
            flag = " BELOW THE %.0f%% FLOOR" % (100 * FLOOR[k[0]])
            bad.append("%s %s: test accuracy %.2f%% < %.0f%%" % (gname(k), label(r), 100 * r["test_accuracy"],
                                                                100 * FLOOR[k[0]]))
        print("| %s | %s | %s | %.2f%%%s | %.4f | %s | %s |" % (gname(k), label(r), unit(r), 100 * r["test_accuracy"],
                                                              flag, r["train_loss"], epochs(r), ratio))
print()
print("mnistcu against the peers (PyTorch, JAX), same run (the peer's time / mnistcu's best time: above 1 means "
      "mnistcu is faster; last, mnistcu's best time / the best peer's time: below 1 means mnistcu is faster):")
for k in groups:
    rs = [r for r in rows if key(r) == k]
    mn = [r for r in rs if r["impl"] == "mnistcu" and not r.get("failed") and fp32(r)]
    th = [r for r in rs if r["impl"] != "mnistcu" and not r.get("failed")]
    for r in rs:  # reduced precision: against the same path in FP32 (time, accuracy)
        if r["impl"] == "mnistcu" and not r.get("failed") and not fp32(r):
            ref = [q for q in mn if q["gemm"] == r["gemm"] and (k[0] not in ("P4", "P5") or q.get("cnn") == r.get("cnn"))
                   and bool(q.get("fused_steps")) == bool(r.get("fused_steps"))]
            if ref:
                q = min(ref, key=t)
                print("  %s: %s %s vs %s %s: %.2fx faster, test accuracy %+.2f points"
                      % (gname(k), label(r), unit(r), label(q), unit(q), t(q) / t(r),
                         100 * (r["test_accuracy"] - q["test_accuracy"])))
    for r in rs:
        if r.get("failed"):
            print("  %s: %s FAILED: %s" % (gname(k), label(r), reason(r)))
    if not mn or not th:
        print("  %s: %s" % (gname(k), "no mnistcu result" if not mn else "no peer result"))
        continue
    b = min(mn, key=t)
    for r in th:
        print("  %s: %s %s vs %s %s: %.2fx" % (gname(k), label(r), unit(r), label(b), unit(b), t(r) / t(b)))
    bp = min(th, key=t)
    print("  %s: mnistcu's best (%s, %s) / the best peer (%s, %s): %.2fx"
          % (gname(k), label(b), unit(b), label(bp), unit(bp), t(b) / t(bp)))
    bt = max(th, key=lambda r: r["test_accuracy"])
    d = 100 * (b["test_accuracy"] - bt["test_accuracy"])
    if abs(d) > 1.5:
        notes.append("%s: mnistcu's test accuracy %.2f%% differs from the best peer accuracy (%s) %.2f%% by %.2f "
                     "points" % (gname(k), 100 * b["test_accuracy"], label(bt), 100 * bt["test_accuracy"], d))
if p6:
    ok = [r for r in p6 if not r.get("failed")]
    hit = sorted(r["seconds_to_target"] for r in ok if r.get("reached"))
    print()
    print("P6, time to %.2f%% MNIST test accuracy (mnistcu's recipe, one run a seed, test set evaluated at epoch "
          "ends, not timed):" % (100 * (ok[0]["target"] if ok else 0.99)))
    for r in p6:
        if r.get("failed"):
            print("  FAILED: %s" % reason(r))
        else:
            print("  seed %s: %s, test accuracy by epoch %s" % (
                r["seed"], "%.4f s" % r["seconds_to_target"] if r.get("reached") else "MISSED",
                " ".join("%.2f%%" % (100 * a) for a in r["test_accuracy_all"])))
    if ok:
        print("  reached in %d of %d runs; median of those %s" % (
            len(hit), len(ok), "%.4f s" % hit[len(hit) // 2] if hit else "-"))
for n in notes:
    print("NOTE: " + n)
if bad:
    print("ACCURACY CHECK FAILED: " + "; ".join(bad))
    sys.exit(3)
EOF
}

# build_cuda_conv: build/cuda_conv with cuDNN (its v3/v4 columns) when one was found, else without
build_cuda_conv() {
    bc_base="$NVCCBIN -O3 -arch=sm_$CUDA_SM -o build/cuda_conv bench/cuda_conv.cu"
    if [ -n "$CUDNN" ]; then
        bc_flags=$(cudnn_flags WITH_CUDNN)
        echo "---- build: $bc_base $bc_flags" >&2
        # shellcheck disable=SC2086
        if $bc_base $bc_flags; then return 0; fi
        echo "(the cuDNN build failed: cuda_conv without its cuDNN columns)" >&2
    else
        echo "(no cuDNN found (CUDNN_DIR): cuda_conv without its cuDNN columns)" >&2
    fi
    echo "---- build: $bc_base" >&2
    $bc_base
}

# build_bench: build/bench_cuda, one binary serving every --gemm/--cnn choice: with cuBLAS and cuDNN,
# else cuBLAS only, else neither; sets HAVE_BENCH, HAVE_CUBLAS, HAVE_CUDNN
build_bench() {
    gc_base="$NVCCBIN -x cu -O3 -arch=sm_$CUDA_SM -o build/bench_cuda bench/bench.c"
    gc_dnn=$(cudnn_flags MNISTCU_CUDNN)
    if [ -n "$gc_dnn" ]; then
        echo "---- build: $gc_base -DMNISTCU_CUBLAS -lcublas $gc_dnn" >&2
        # shellcheck disable=SC2086
        if $gc_base -DMNISTCU_CUBLAS -lcublas $gc_dnn; then HAVE_BENCH=1; HAVE_CUBLAS=1; HAVE_CUDNN=1
        else echo "(the cuDNN build failed: no cuDNN rows)" >&2; fi
    else
        echo "(no cuDNN found (CUDNN_DIR): no mnistcu cuDNN rows)" >&2
    fi
    if [ "$HAVE_BENCH" = 0 ]; then
        echo "---- build: $gc_base -DMNISTCU_CUBLAS -lcublas" >&2
        if $gc_base -DMNISTCU_CUBLAS -lcublas; then HAVE_BENCH=1; HAVE_CUBLAS=1
        else
            echo "---- the cuBLAS build failed; build: $gc_base" >&2
            if $gc_base; then HAVE_BENCH=1; echo "(mnistcu without cuBLAS: no cuBLAS rows)" >&2
            else failed "building build/bench_cuda (mnistcu rows missing)"; fi
        fi
    fi
}

# prebuilt_bench (PREBUILT=1): build/bench_cuda as it is; its rows as its --build-info says. The report's
# commit line is the tree's, which the binary need not match: a source newer than it is named.
prebuilt_bench() {
    if pb_info=$(build/bench_cuda --build-info 2> /dev/null); then
        echo "---- PREBUILT=1: build/bench_cuda as it is ($pb_info)" >&2
        pb_newer=$(find mnistcu.h bench/bench.c -newer build/bench_cuda 2> /dev/null | tr '\n' ' ')
        [ -z "$pb_newer" ] || echo "NOTE: PREBUILT=1: ${pb_newer}newer than build/bench_cuda, which may not hold them" >&2
        case " $pb_info " in *" cuda "*) HAVE_BENCH=1 ;; esac
        case " $pb_info " in *" cublas "*) HAVE_CUBLAS=1 ;; esac
        case " $pb_info " in *" cudnn "*) HAVE_CUDNN=1 ;; esac
        [ "$HAVE_BENCH" = 1 ] || failed "PREBUILT=1: build/bench_cuda is not a CUDA build ($pb_info)"
    else
        failed "PREBUILT=1: build/bench_cuda is missing, does not run, or predates --build-info (mnistcu rows missing)"
    fi
}

gpu_configs() {
    [ -n "$NVCCBIN" ] || { failed "nvcc not found (set NVCC); for the CPU run use: sh bench/run.sh cpu"; return; }
    nvidia-smi -L > /dev/null 2>&1 || { failed "no GPU (nvidia-smi -L fails); for the CPU run use: sh bench/run.sh cpu"; return; }
    [ -n "$PY" ] || failed "PyTorch not importable: the PyTorch side will be missing"
    for gc_peer in $PEERS; do
        case $gc_peer in
            eager|graph|compile|jax) ;;
            *) failed "unknown peer $gc_peer in PEERS (eager graph compile jax)" ;;
        esac
    done
    HAVE_BENCH=0; HAVE_CUBLAS=0; HAVE_CUDNN=0
    if [ "$PREBUILT" = 1 ]; then
        prebuilt_bench
    else
        build_bench
    fi
    for C in $CONFIGS; do
        case $C in
            P1) EP=10; CD=$D ;;
            P2|P3) EP=$EPOCHS; CD=$D ;;
            P4) EP=$CNN_EPOCHS; CD=$D ;;
            P5) EP=$CNN_EPOCHS; CD=$FD
                if [ -z "$CD" ]; then failed "P5: Fashion-MNIST not found in $FASHION_DATA (nor data/fashion-mnist, ../shared/datasets/fashion-mnist): sh data/fetch.sh fashion"; continue; fi ;;
            P6)  # time to 99.0%: mnistcu's recipe (bench.c), once per seed, our convolutions and cuBLAS's dense
                 # products where built with it (faster there: bench/RESULTS.md), else ours; no peer rows
                if [ "$HAVE_BENCH" = 1 ]; then
                    gc_gemm=own
                    if [ "$HAVE_CUBLAS" = 1 ]; then gc_gemm=cublas; fi
                    for gc_seed in $P6_SEEDS; do
                        run_json "mnistcu P6 seed $gc_seed" build/bench_cuda P6 --device cuda --gemm "$gc_gemm" --cnn own \
                            --seed "$gc_seed" --data "$D"
                    done
                fi
                continue ;;
            *) failed "unknown configuration $C in CONFIGS (P1 P2 P3 P4 P5 P6 run on the GPU)"; continue ;;
        esac
        if [ "$HAVE_BENCH" = 1 ]; then
            case $C in
                P4|P5)  # the CNNs: own kernels throughout, then cuBLAS for the products, then cuBLAS + cuDNN
                    run_json "mnistcu $C own" build/bench_cuda "$C" --device cuda --gemm own --cnn own --epochs "$EP" --data "$CD"
                    if [ "$C" = P4 ] && [ "$GPU_CC_MAJOR" -ge 9 ] 2>/dev/null; then  # the opt-in fused LeNet-5 kernel
                        run_json "mnistcu P4 own fused-cnn" build/bench_cuda P4 --device cuda --gemm own --cnn own --fused-cnn on \
                            --epochs "$EP" --data "$CD"
                    fi
                    if [ "$HAVE_CUBLAS" = 1 ]; then
                        run_json "mnistcu $C cublas" build/bench_cuda "$C" --device cuda --gemm cublas --cnn own --epochs "$EP" --data "$CD"
                    fi
                    if [ "$HAVE_CUDNN" = 1 ]; then
                        run_json "mnistcu $C cublas+cudnn" build/bench_cuda "$C" --device cuda --gemm cublas --cnn cudnn --epochs "$EP" --data "$CD"
                    fi ;;
                *)
                    run_json "mnistcu $C own" build/bench_cuda "$C" --device cuda --gemm own --epochs "$EP" --data "$CD"
                    case $C in P1|P2)  # the same bits step by step: what the fused kernel gains; and the
                                       # opt-in cluster kernel (not bitwise) where the GPU has clusters
                        run_json "mnistcu $C own unfused" build/bench_cuda "$C" --device cuda --gemm own --fused off --epochs "$EP" --data "$CD"
                        if [ "$GPU_CC_MAJOR" -ge 9 ] 2>/dev/null; then
                            run_json "mnistcu $C own fused-clusters" build/bench_cuda "$C" --device cuda --gemm own \
                                --fused-mlp-clusters on --epochs "$EP" --data "$CD"
                        fi ;;
                    esac
                    if [ "$HAVE_CUBLAS" = 1 ]; then
                        run_json "mnistcu $C cublas" build/bench_cuda "$C" --device cuda --gemm cublas --epochs "$EP" --data "$CD"
                    fi ;;
            esac
            gc_precs=$PRECISIONS
            if [ "$CUDA_ARCH" -lt 80 ] 2>/dev/null; then gc_precs=""; fi  # no tensor cores for TF32/BF16 before sm_80
            for gc_prec in $gc_precs; do  # the tensor cores: own kernels, then cuBLAS (the CNNs: own convolutions)
                run_json "mnistcu $C own $gc_prec" build/bench_cuda "$C" --device cuda --gemm own --cnn own \
                    --precision "$gc_prec" --epochs "$EP" --data "$CD"
                if [ "$HAVE_CUBLAS" = 1 ]; then
                    run_json "mnistcu $C cublas $gc_prec" build/bench_cuda "$C" --device cuda --gemm cublas --cnn own \
                        --precision "$gc_prec" --epochs "$EP" --data "$CD"
                fi
            done
        fi
        # the peers (PEERS), each in its own process; a failed one leaves a failed row
        for gc_peer in $PEERS; do
            case $gc_peer in
                eager|graph|compile)
                    if [ -z "$PY" ]; then
                        fail_row "torch-$gc_peer" "$C" "PyTorch not importable (PYTHON)"
                        continue
                    fi ;;
            esac
            case $gc_peer in
                eager)
                    run_peer torch-eager "$C" "torch-eager $C" "$PY" bench/torch_bench.py "$C" --device cuda \
                        --mode eager --epochs "$EP" --data "$CD" ;;
                graph)
                    run_peer torch-graph "$C" "torch-graph $C" "$PY" bench/torch_bench.py "$C" --device cuda \
                        --mode graph --epochs "$EP" --data "$CD"
                    case $C in P4|P5)
                        if [ "$CUDNN_BENCH" = 1 ]; then
                            run_peer torch-graph+cudnn-benchmark "$C" "torch-graph+cudnn.benchmark $C" "$PY" \
                                bench/torch_bench.py "$C" --device cuda --mode graph --cudnn-benchmark --epochs "$EP" --data "$CD"
                        fi ;;
                    esac ;;
                compile)  # torch.compile (max-autotune kernels), the step captured in one CUDA graph
                    run_peer torch-compile "$C" "torch-compile $C" "$PY" bench/torch_bench.py "$C" --device cuda \
                        --mode compile --epochs "$EP" --data "$CD" ;;
                jax)      # each epoch one jitted lax.scan
                    run_peer jax-scan "$C" "jax-scan $C" "$JPY" bench/jax_bench.py "$C" --device cuda \
                        --epochs "$EP" --data "$CD" ;;
            esac
        done
    done
}

cpu_configs() {
    CCBIN=${CC:-cc}
    echo "---- build: $CCBIN -std=c99 -O3 -march=native -fopenmp -o build/bench_cpu bench/bench.c -lm" >&2
    if $CCBIN -std=c99 -O3 -march=native -fopenmp -o build/bench_cpu bench/bench.c -lm; then
        HAVE_BENCH=1
    else
        failed "building build/bench_cpu (mnistcu rows missing)"; HAVE_BENCH=0
    fi
    if [ "$CPU_CNN_LIMIT" != 0 ]; then
        echo "NOTE: the CPU LeNet-5 rows train on the first $CPU_CNN_LIMIT images only (CPU_CNN_LIMIT), not a full epoch"
    fi
    if [ "$HAVE_BENCH" = 1 ]; then
        run_json "mnistcu P7 cpu 1 thread" build/bench_cpu P7 --threads 1 --epochs "$EPOCHS" --data "$D"
        run_json "mnistcu P7 cpu 2 threads" build/bench_cpu P7 --threads 2 --epochs "$EPOCHS" --data "$D"
    fi
    if [ -n "$PY" ]; then
        run_json "torch-eager P7 cpu" "$PY" bench/torch_bench.py P7 --device cpu --epochs "$TORCH_CPU_EPOCHS" --data "$D"
    else
        echo "(PyTorch not importable: PyTorch CPU skipped)"
    fi
    for T in 1 2; do
        if [ "$HAVE_BENCH" = 1 ]; then
            run_json "mnistcu P4 (LeNet-5) cpu $T thread(s)" build/bench_cpu P4 --device cpu --threads "$T" \
                --epochs "$CPU_CNN_EPOCHS" --limit "$CPU_CNN_LIMIT" --warmup-limit "$CPU_CNN_WARMUP" --data "$D"
        fi
        if [ -n "$PY" ]; then
            run_json "torch-eager P4 (LeNet-5) cpu $T thread(s)" "$PY" bench/torch_bench.py P4 --device cpu --threads "$T" \
                --epochs "$CPU_CNN_EPOCHS" --limit "$CPU_CNN_LIMIT" --warmup-limit "$CPU_CNN_WARMUP" --data "$D"
        fi
    done
}

kernels() {
    for K in $KERNELS; do
        case $K in
            gemm)
                echo
                echo "== matrix-product kernels (bench/cuda_gemm.cu)"
                echo "---- build: $NVCCBIN -O3 -arch=sm_$CUDA_SM bench/cuda_gemm.cu -o build/cuda_gemm -lcublas" >&2
                if "$NVCCBIN" -O3 -arch=sm_"$CUDA_SM" bench/cuda_gemm.cu -o build/cuda_gemm -lcublas; then
                    run_kernel build/cuda_gemm "$OUTDIR/cuda_gemm.txt"
                else
                    failed "building build/cuda_gemm"
                fi ;;
            conv)
                echo
                echo "== convolution kernels (bench/cuda_conv.cu)"
                if build_cuda_conv; then
                    run_kernel build/cuda_conv "$OUTDIR/cuda_conv.txt"
                else
                    failed "building build/cuda_conv"
                fi ;;
            *) failed "unknown kernel program $K in KERNELS (gemm, conv)" ;;
        esac
    done
}

# run_kernel PROGRAM OUTPUT_FILE: run it (at most BENCH_TIMEOUT s), keep stdout and stderr in the file, show it
run_kernel() {
    echo "---- $1" >&2
    if [ -n "$TIMEOUT_BIN" ]; then "$TIMEOUT_BIN" -k 10 "$BENCH_TIMEOUT" "$1" > "$2" 2>&1; else "$1" > "$2" 2>&1; fi
    rk_rc=$?
    cat "$2"
    [ "$rk_rc" -eq 0 ] || failed "$1 (exit $rk_rc; see $2)"
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
    CUDNN=$(find_cudnn)
    if [ -n "$PY" ]; then
        echo "torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())') ($PY)"
    else
        echo "torch: not importable (tried \$PYTHON, python3, /usr/bin/python3, python)"
    fi
    JPY=
    if [ "$MODE" = gpu ] && has_peer jax; then
        if JPY=$(find_jax_python); then
            echo "jax: $("$JPY" -c 'import jax; print(jax.__version__)' 2>&1 | tail -n 1) ($JPY)"
        else
            # jax_bench.py itself then reports why, as the jax rows' reason
            JPY=${JAX_PYTHON:-${PY:-python3}}
            echo "jax: not importable (tried \$JAX_PYTHON, PyTorch's python, python3, /usr/bin/python3, python): the jax-scan rows will fail"
        fi
    fi
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (working tree modified)')"
    if [ "$MODE" = gpu ]; then
        echo "cudnn: ${CUDNN:-none found (CUDNN_DIR)}"
        echo "settings: CONFIGS=\"$CONFIGS\" PEERS=\"$PEERS\" EPOCHS=$EPOCHS CNN_EPOCHS=$CNN_EPOCHS CUDNN_BENCH=$CUDNN_BENCH KERNELS=\"$KERNELS\" PRECISIONS=\"$PRECISIONS\" PREBUILT=$PREBUILT BENCH_TIMEOUT=$BENCH_TIMEOUT"
    else
        echo "settings: EPOCHS=$EPOCHS TORCH_CPU_EPOCHS=$TORCH_CPU_EPOCHS CPU_CNN_EPOCHS=$CPU_CNN_EPOCHS CPU_CNN_LIMIT=$CPU_CNN_LIMIT CPU_CNN_WARMUP=$CPU_CNN_WARMUP BENCH_TIMEOUT=$BENCH_TIMEOUT"
    fi
    D=$(find_dataset "$DATA" mnist) || { failed "MNIST not found in $DATA (nor data/mnist, ../shared/datasets/mnist): run sh data/fetch.sh mnist or set DATA"; return; }
    echo "data: $D"
    FD=$(find_dataset "$FASHION_DATA" fashion-mnist) || FD=
    [ -z "$FD" ] || echo "fashion data: $FD"

    if [ "$MODE" = cpu ]; then cpu_configs; else gpu_configs; fi

    if [ "$MODE" = gpu ] && [ -n "$NVCCBIN" ] && nvidia-smi -L > /dev/null 2>&1; then kernels; fi

    # the summary, last, so that the end of the output holds it
    TPY=${PY:-$(command -v python3 || echo /usr/bin/python3)}
    {
        echo
        sm_gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1) || sm_gpu=
        echo "== SUMMARY ($MODE, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+modified'), ${sm_gpu:-no GPU}, $(nproc 2>/dev/null || echo '?') CPU cores)"
        echo "time: P1 = total seconds of 10 epochs; others = median ms per timed epoch. epochs: warm-up epochs (fraction of one when limited) + timed epochs; the accuracy is after all of them."
        if [ -s "$RES" ]; then
            table "$TPY"
            tb_rc=$?
            if [ "$tb_rc" -eq 3 ]; then failed "a test accuracy is below its floor"
            elif [ "$tb_rc" -ne 0 ]; then failed "printing the table"; fi
        else
            echo "(no results)"
        fi
        if [ -s "$OUTDIR/cuda_gemm.txt" ]; then
            echo
            sed -n '/^GFLOP\/s (FP32)/,$p' "$OUTDIR/cuda_gemm.txt"
        fi
        if [ -s "$OUTDIR/cuda_conv.txt" ]; then
            echo
            sed -n '/^Convolution passes on/,$p' "$OUTDIR/cuda_conv.txt"
            grep 'FAILED' "$OUTDIR/cuda_conv.txt" || true
        fi
        echo
        echo "wall time of bench/run.sh: $(( $(date +%s) - T_START )) s"
    } | tee "$SUMMARY"
}

main 2>&1 | tee "$LOG"
RC=$(cat "$STATUS")
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT" && cp "$RES" "$LOG" "$OUT"/ &&
        for f in "$SUMMARY" "$OUTDIR/cuda_gemm.txt" "$OUTDIR/cuda_conv.txt"; do [ ! -f "$f" ] || cp "$f" "$OUT"/; done
fi
if [ "$RC" != 0 ]; then
    echo "bench/run.sh: SOME STEPS FAILED (see above and $LOG)" >&2
    exit 1
fi
echo "bench/run.sh: done; results in $RES, $SUMMARY and $LOG"
