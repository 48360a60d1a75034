#!/bin/sh
# `make test-interop`: model files across frameworks, with the tools this machine has.
#   - mnistcu -> PyTorch: models trained and saved by the CLI (an MLP, LeNet-5, and a model with every
#     layer kind) load into torch.nn.Sequential with load_state_dict(strict=True), and PyTorch's logits on
#     the 10,000 test images equal mnistcu's within 1e-5 (tools/mnistcu_torch.py check);
#   - PyTorch -> mnistcu: a model trained and saved by PyTorch is evaluated by mnistcu with the same accuracy;
#   - ONNX: exported models pass onnx.checker and ONNX Runtime (Python's, or onnxruntime-node fetched from
#     the npm registry) gives mnistcu's logits within 1e-5.
# A tool that is missing skips its checks with a message; a check that runs and fails fails the target.
# Usage: sh tests/interop_test.sh CLI [DATA_DIR]
set -u
CLI=${1:?"usage: $0 CLI [DATA_DIR]"}
DATA=${2:-data}
PY=${PYTHON_TORCH:-/usr/bin/python3}
DEVICE=${MNISTCU_DEVICE:-cpu}  # where mnistcu trains and evaluates (the GPU machine: cuda)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mnistcu-interop.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail=0
pass() { echo "ok    $1"; }
bad() { echo "FAIL  $1"; fail=1; }

if ! "$PY" -c 'import torch, numpy' >/dev/null 2>&1; then
    echo "skipped: PyTorch and NumPy are not importable by $PY (apt-get install python3-torch python3-numpy)"
else
    n=0
    for spec in "784-64-10" "lenet5" "fashion-cnn" \
        "1x28x28 conv3x3x8:s=2:p=1:bias=0 batchnorm:eps=0.001:momentum=0.01 leaky_relu0.2 avgpool3x2:s=1 maxpool2 flatten dropout0.25 dense32 sigmoid batchnorm tanh dense10 softmax"; do
        n=$((n + 1))
        if "$CLI" train --data "$DATA" --model "$spec" --limit 1500 --epochs 1 --lr 0.05 --momentum 0.9 --device "$DEVICE" \
               --quiet --save "$TMP/m$n.safetensors" >"$TMP/out" 2>"$TMP/err" &&
           "$CLI" eval --data "$DATA" --model "$TMP/m$n.safetensors" --device "$DEVICE" --quiet \
               --save-logits "$TMP/m$n.logits" >"$TMP/out" 2>"$TMP/err" &&
           "$PY" tools/mnistcu_torch.py check "$TMP/m$n.safetensors" --data "$DATA/mnist" --logits "$TMP/m$n.logits" \
               >"$TMP/check" 2>&1; then
            pass "mnistcu -> PyTorch $(torch_version() { "$PY" -c 'import torch; print(torch.__version__)'; }; torch_version): $spec: $(tail -n 1 "$TMP/check")"
        else
            bad "mnistcu -> PyTorch: $spec: $(tail -n 2 "$TMP/err" "$TMP/check" 2>/dev/null | tr '\n' ' ')"
        fi
    done
    if "$PY" tools/mnistcu_torch.py train-torch --spec "784-64-10" --data "$DATA/mnist" --out "$TMP/t.safetensors" \
           --epochs 1 >"$TMP/torch" 2>"$TMP/err" &&
       "$CLI" eval --data "$DATA" --model "$TMP/t.safetensors" --device cpu --quiet >"$TMP/out" 2>>"$TMP/err" &&
       "$PY" -c '
import json, sys
t = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
m = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
print("PyTorch %.4f, mnistcu %.4f" % (t["accuracy"], m["test_accuracy"]))
sys.exit(0 if abs(t["accuracy"] - m["test_accuracy"]) < 1e-9 else 1)' "$TMP/torch" "$TMP/out" >"$TMP/cmp" 2>&1; then
        pass "PyTorch -> mnistcu: 784-64-10 trained by PyTorch, the same test accuracy: $(cat "$TMP/cmp")"
    else
        bad "PyTorch -> mnistcu: $(cat "$TMP/cmp" "$TMP/err" 2>/dev/null | tail -n 3 | tr '\n' ' ')"
    fi
fi

# ---- ONNX: the models above, exported, checked and run ------------------------------------
if [ ! -f "$TMP/m1.safetensors" ]; then
    echo "skipped: ONNX checks (no models were made above)"
elif ! "$PY" -c 'import onnx, numpy' >/dev/null 2>&1; then
    echo "skipped: ONNX checks: the onnx package is not importable by $PY (apt-get install python3-onnx)"
else
    runtime=python
    if ! "$PY" -c 'import onnxruntime' >/dev/null 2>&1; then
        runtime=node
        if ! NODE_PATH=$(sh tools/fetch_onnxruntime.sh 2>"$TMP/npm_err"); then
            runtime=none
            echo "skipped: ONNX Runtime: neither Python's onnxruntime nor onnxruntime-node from npm ($(tail -n 1 "$TMP/npm_err"))"
        fi
        export NODE_PATH
    fi
    "$PY" -c '
import gzip, sys, numpy as np
p = sys.argv[1] + "/mnist/t10k-images-idx3-ubyte"
try:
    b = gzip.open(p + ".gz").read()
except OSError:
    b = open(p, "rb").read()
np.frombuffer(b, dtype=np.uint8, offset=16).astype(np.float32).tofile(sys.argv[2])' "$DATA" "$TMP/pixels.f32"
    for k in 1 2 3 4; do
        [ -f "$TMP/m$k.safetensors" ] || continue
        if ! "$CLI" export --onnx "$TMP/m$k.onnx" --model "$TMP/m$k.safetensors" >"$TMP/out" 2>"$TMP/err"; then
            bad "export --onnx model $k: $(tail -n 1 "$TMP/err")"
            continue
        fi
        model=$(tail -n 1 "$TMP/out" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["model"])')
        if [ "$runtime" = none ]; then
            "$PY" tools/onnx_check.py "$TMP/m$k.onnx" >"$TMP/check" 2>&1 && pass "ONNX checker: $model" ||
                bad "ONNX checker: $model: $(tail -n 2 "$TMP/check" | tr '\n' ' ')"
        elif "$PY" tools/onnx_check.py "$TMP/m$k.onnx" --input "$TMP/pixels.f32" --shape 10000,1,28,28 \
                 --expect "$TMP/m$k.logits" --runtime "$runtime" >"$TMP/check" 2>&1; then
            pass "ONNX ($runtime runtime) equals mnistcu within 1e-5: $model: $(tail -n 1 "$TMP/check" | cut -c1-90)"
        else
            bad "ONNX: $model: $(tail -n 3 "$TMP/check" | tr '\n' ' ')"
        fi
    done
fi

[ "$fail" -eq 0 ] && echo "interop test: ok" || echo "interop test: FAILED"
exit "$fail"
