#!/bin/sh
# Install ONNX Runtime for Node.js (the npm package onnxruntime-node, whose tarball ships the CPU
# library for Linux x64/arm64, macOS arm64 and Windows) so that tools/onnx_run.js and
# tools/onnx_check.py --runtime node can run ONNX files written by mnistcu.h.
#
# Usage: sh tools/fetch_onnxruntime.sh [DIR]
#
#   DIR defaults to build/onnxruntime-node under the repository root (build/ is ignored by git).
#   The package goes to DIR/node_modules/onnxruntime-node; nothing is downloaded when the pinned
#   version is already there. The script then checks that node can load the module, create an
#   InferenceSession on a tiny opset-13 model and run it.
#
#   On success it prints one line on stdout, the folder to put in NODE_PATH, and exits 0:
#       NODE_PATH=$(sh tools/fetch_onnxruntime.sh) node tools/onnx_run.js ...
#   (tools/onnx_run.js also looks in build/onnxruntime-node/node_modules by itself.)
#   Progress and errors go to stderr; on failure it exits 1.
#
# Version: onnxruntime-node 1.30.0 (ONNX Runtime 1.30.0, N-API 6), installed and run with Node 20
# and npm 11 on Debian 12 x64. It runs opset-13 models (IR 7) and loads anything from IR 3 / opset 7
# up to IR 12 / opset 25. Override with ONNXRUNTIME_NODE_VERSION=X.Y.Z in the environment.
#
# npm runs with --ignore-scripts: the package's post-install script would try to download GPU
# (CUDA/TensorRT) binaries, which are neither needed nor reachable here. About 290 MiB on disk,
# most of it the libraries for other platforms.

set -u

VERSION=${ONNXRUNTIME_NODE_VERSION:-1.30.0}

say() { printf '%s\n' "fetch_onnxruntime: $*" >&2; }
die() { say "error: $*"; exit 1; }

root=$(cd "$(dirname "$0")/.." && pwd) || die "cannot find the repository root"
dir=${1:-$root/build/onnxruntime-node}

command -v node >/dev/null 2>&1 || die "node (Node.js) is not installed; on Debian: apt-get install nodejs npm"

mkdir -p "$dir" || die "cannot create $dir"
dir=$(cd "$dir" && pwd) || die "cannot enter $dir"
modules=$dir/node_modules
pkg=$modules/onnxruntime-node/package.json

installed_version() {
    [ -f "$pkg" ] || return 0
    node -e 'try { process.stdout.write(String(require(process.argv[1]).version)); } catch (e) {}' "$pkg" 2>/dev/null
}

have=$(installed_version)
if [ "$have" = "$VERSION" ]; then
    say "onnxruntime-node $VERSION already in $modules"
else
    command -v npm >/dev/null 2>&1 || die "npm is not installed; on Debian: apt-get install npm"
    if [ -n "$have" ]; then
        say "replacing onnxruntime-node $have in $modules with $VERSION"
    else
        say "installing onnxruntime-node $VERSION into $modules (about 290 MiB)"
    fi
    # npm's own output goes to stderr so that stdout carries only the path.
    if ! npm install --ignore-scripts --no-audit --no-fund --prefix "$dir" "onnxruntime-node@$VERSION" 1>&2; then
        die "npm install of onnxruntime-node@$VERSION failed (no network access to the npm registry, or no such version?)"
    fi
    have=$(installed_version)
    [ "$have" = "$VERSION" ] || die "npm finished but $pkg does not say version $VERSION (it says '${have:-nothing}')"
fi

# Load the module from the folder just filled (not from any other NODE_PATH entry), create a
# session on a tiny model (opset 13, IR 7, y = Relu(x), x: float32 [N, 2] with a dynamic N) and run it.
check_js='
const modulePath = process.argv[1];
let ort;
try {
    ort = require(modulePath);
} catch (e) {
    console.error("cannot load " + modulePath + " on " + process.platform + "-" + process.arch +
                  " with node " + process.version + ": " + (e && e.message ? e.message : e));
    process.exit(1);
}
const model = Buffer.from(
    "08073a3d0a0c0a0178120179220452656c751201675a140a0178120f0a0d080112090a0312014e0a0208026214" +
    "0a0179120f0a0d080112090a0312014e0a02080242040a00100d", "hex");
(async () => {
    const session = await ort.InferenceSession.create(model, { executionProviders: ["cpu"] });
    const x = new ort.Tensor("float32", Float32Array.from([-1.5, 2, 3, -4]), [2, 2]);
    const y = (await session.run({ x: x })).y;
    const want = [0, 2, 3, 0];
    if (!y || y.dims.join(",") !== "2,2" || !want.every((v, i) => y.data[i] === v))
        throw new Error("wrong result " + (y ? Array.from(y.data).join(",") : "(none)"));
    const v = ort.env && ort.env.versions ? ort.env.versions.node || ort.env.versions.common : "";
    console.error("fetch_onnxruntime: onnxruntime-node " + (v || "?") + " loads and runs on " +
                  process.platform + "-" + process.arch + " with node " + process.version);
})().catch((e) => {
    console.error("InferenceSession failed: " + (e && e.message ? e.message : e));
    process.exit(1);
});
'
node -e "$check_js" "$modules/onnxruntime-node" ||
    die "onnxruntime-node in $modules does not work on this machine (see the message above)"

printf '%s\n' "$modules"
