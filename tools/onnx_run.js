#!/usr/bin/env node
// Run an ONNX model with ONNX Runtime for Node.js (onnxruntime-node) on the CPU.
//
// Usage: node tools/onnx_run.js MODEL.onnx INPUT.f32 N C H W OUTPUT.f32
//
//   INPUT.f32   raw little-endian float32, N*C*H*W values, laid out [N][C][H][W]
//   OUTPUT.f32  written: the model's first output as raw little-endian float32
//
// The input is fed with the shape the model declares for its input: [N, C, H, W] for an image
// input, [N, C*H*W] for a flat one (give C=H=1, W=features), or [N, d1, d2, ...] whenever the model
// declares static non-batch dimensions whose product is C*H*W. When the runtime gives no input
// metadata, [N, C, H, W] is tried first and [N, C*H*W] second. Batches run in chunks of 1000
// (ONNX_RUN_CHUNK overrides), so the model needs a dynamic batch dimension; a model whose batch
// dimension is fixed at k runs in chunks of k, with a warning.
//
// On success it prints one JSON line on stdout:
//   {"output_shape": [...], "seconds": S, "load_seconds": L, "input_name": ..., "input_shape": [...],
//    "output_name": ..., "onnxruntime": "1.30.0"}
// where seconds is the time spent in session.run over all chunks and load_seconds the time to
// create the session. Messages go to stderr.
//
// The module is found through NODE_PATH, else in build/onnxruntime-node/node_modules under the
// repository root (where `sh tools/fetch_onnxruntime.sh` installs it).
//
// Exit status: 0 success, 1 the model failed to load or run, 2 bad arguments or files,
// 3 onnxruntime-node not found.

'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');

const USAGE = 'usage: node tools/onnx_run.js MODEL.onnx INPUT.f32 N C H W OUTPUT.f32';

function fail(code, msg) {
    process.stderr.write('onnx_run: ' + msg + '\n');
    process.exit(code);
}

function message(e) {
    return e && e.message ? e.message : String(e);
}

function loadRuntime() {
    const tried = [];
    try {
        return require('onnxruntime-node');
    } catch (e) {
        if (e && e.code !== 'MODULE_NOT_FOUND') tried.push('NODE_PATH: ' + message(e));
    }
    const local = path.join(__dirname, '..', 'build', 'onnxruntime-node', 'node_modules', 'onnxruntime-node');
    try {
        return require(local);
    } catch (e) {
        if (e && e.code !== 'MODULE_NOT_FOUND') tried.push(local + ': ' + message(e));
    }
    fail(3, 'onnxruntime-node not found (looked in NODE_PATH and ' + path.dirname(local) + ')' +
         (tried.length ? '; ' + tried.join('; ') : '') + '; install it with: sh tools/fetch_onnxruntime.sh');
}

function parseDim(s, name) {
    if (!/^[0-9]+$/.test(s) || Number(s) < 1 || !Number.isSafeInteger(Number(s)))
        fail(2, name + ' must be a positive integer, not "' + s + '"\n' + USAGE);
    return Number(s);
}

const LITTLE = os.endianness() === 'LE';

function readFloats(file, count) {
    let buf;
    try {
        buf = fs.readFileSync(file);
    } catch (e) {
        fail(2, 'cannot read ' + file + ': ' + message(e));
    }
    if (buf.length !== count * 4)
        fail(2, file + ' has ' + buf.length + ' bytes, but N*C*H*W float32 values take ' + count * 4);
    const out = new Float32Array(count);
    if (LITTLE) {
        // Copy: the Buffer's byte offset need not be a multiple of 4.
        new Uint8Array(out.buffer).set(buf);
    } else {
        for (let i = 0; i < count; i++) out[i] = buf.readFloatLE(4 * i);
    }
    return out;
}

function writeFloats(file, data) {
    let buf;
    if (LITTLE) {
        buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    } else {
        buf = Buffer.alloc(data.length * 4);
        for (let i = 0; i < data.length; i++) buf.writeFloatLE(data[i], 4 * i);
    }
    try {
        fs.writeFileSync(file, buf);
    } catch (e) {
        fail(2, 'cannot write ' + file + ': ' + message(e));
    }
}

// The metadata of the input called name, or null when this onnxruntime-node has none
// (inputMetadata came in later versions; it is an array in 1.2x/1.30).
function inputMeta(session, name) {
    const md = session.inputMetadata;
    if (!md) return null;
    if (Array.isArray(md)) return md.find((m) => m && m.name === name) || null;
    return md[name] || null;
}

const isStatic = (d) => typeof d === 'number' && Number.isInteger(d) && d > 0;

// Shapes to try for one sample ([dims after the batch one]), and the fixed batch size if any.
function plan(meta, c, h, w) {
    const features = c * h * w;
    if (!meta || !Array.isArray(meta.shape) || meta.shape.length === 0)
        return { tails: [[c, h, w], [features]], fixedBatch: 0 };
    if (meta.isTensor === false) fail(1, 'the model input "' + meta.name + '" is not a tensor');
    if (meta.type && meta.type !== 'float32')
        fail(1, 'the model input "' + meta.name + '" is ' + meta.type + ', not float32');
    const shape = meta.shape;
    const fixedBatch = isStatic(shape[0]) ? shape[0] : 0;
    const rest = shape.slice(1);
    if (rest.length > 0 && rest.every(isStatic)) {
        const product = rest.reduce((a, b) => a * b, 1);
        if (product !== features)
            fail(2, 'the model input "' + meta.name + '" is [' + shape.join(', ') + '], ' + product +
                 ' values a sample, but C*H*W = ' + features);
        return { tails: [rest], fixedBatch };
    }
    if (shape.length === 4) return { tails: [[c, h, w]], fixedBatch };
    if (shape.length === 3) return { tails: [[c, h * w]], fixedBatch };
    if (shape.length === 2) return { tails: [[features]], fixedBatch };
    fail(2, 'cannot feed C, H, W to the model input "' + meta.name + '" of shape [' + shape.join(', ') + ']');
}

async function main() {
    const argv = process.argv.slice(2);
    if (argv.length === 1 && (argv[0] === '-h' || argv[0] === '--help')) {
        process.stdout.write(USAGE + '\n');
        return;
    }
    if (argv.length !== 7) fail(2, USAGE);
    const [modelPath, inputPath] = argv;
    const n = parseDim(argv[2], 'N'), c = parseDim(argv[3], 'C'), h = parseDim(argv[4], 'H'), w = parseDim(argv[5], 'W');
    const outputPath = argv[6];
    const features = c * h * w;
    if (!fs.existsSync(modelPath)) fail(2, 'no such model file: ' + modelPath);

    const ort = loadRuntime();
    const input = readFloats(inputPath, n * features);

    let session;
    const t0 = process.hrtime.bigint();
    try {
        session = await ort.InferenceSession.create(modelPath, { executionProviders: ['cpu'] });
    } catch (e) {
        fail(1, 'cannot load ' + modelPath + ': ' + message(e));
    }
    const loadSeconds = Number(process.hrtime.bigint() - t0) / 1e9;
    if (session.inputNames.length !== 1)
        fail(1, 'the model has ' + session.inputNames.length + ' inputs (' + session.inputNames.join(', ') + '); one is expected');
    const inputName = session.inputNames[0];
    const outputName = session.outputNames[0];
    const { tails, fixedBatch } = plan(inputMeta(session, inputName), c, h, w);

    let chunk = Number(process.env.ONNX_RUN_CHUNK || 1000);
    if (!Number.isInteger(chunk) || chunk < 1) fail(2, 'ONNX_RUN_CHUNK must be a positive integer');
    if (fixedBatch) {
        if (n % fixedBatch !== 0)
            fail(1, 'the model input has a fixed batch dimension of ' + fixedBatch + ', which does not divide N = ' + n);
        if (fixedBatch !== n)
            process.stderr.write('onnx_run: warning: the model input has a fixed batch dimension of ' + fixedBatch +
                                 ' (a dynamic one is expected); running ' + n / fixedBatch + ' batches of ' + fixedBatch + '\n');
        chunk = fixedBatch;
    }

    let tail = null;
    let outTail = null;
    let output = null;
    let seconds = 0;
    for (let start = 0; start < n; start += chunk) {
        const m = Math.min(chunk, n - start);
        const data = input.slice(start * features, (start + m) * features);
        let result = null;
        const errors = [];
        for (const t of tail ? [tail] : tails) {
            const feed = {};
            feed[inputName] = new ort.Tensor('float32', data, [m].concat(t));
            const t1 = process.hrtime.bigint();
            try {
                result = await session.run(feed);
            } catch (e) {
                errors.push('[' + [m].concat(t).join(', ') + ']: ' + message(e));
                continue;
            }
            seconds += Number(process.hrtime.bigint() - t1) / 1e9;
            tail = t;
            break;
        }
        if (!result) fail(1, 'run failed with input shape ' + errors.join('; with input shape '));
        const y = result[outputName];
        if (!y) fail(1, 'the model gave no output "' + outputName + '"');
        const dims = Array.from(y.dims, Number);
        if (dims.length === 0 || dims[0] !== m)
            fail(1, 'output "' + outputName + '" has shape [' + dims.join(', ') + '] for a batch of ' + m +
                 ' (the batch dimension should come first)');
        if (y.type !== 'float32')
            process.stderr.write('onnx_run: warning: output "' + outputName + '" is ' + y.type + '; written as float32\n');
        if (!output) {
            outTail = dims.slice(1);
            output = new Float32Array(n * outTail.reduce((a, b) => a * b, 1));
        } else if (dims.slice(1).join(',') !== outTail.join(',')) {
            fail(1, 'output shape changed between batches: [' + dims.join(', ') + ']');
        }
        const values = y.data instanceof Float32Array ? y.data : Float32Array.from(y.data, Number);
        output.set(values, start * (output.length / n));
    }
    writeFloats(outputPath, output);

    const versions = ort.env && ort.env.versions ? ort.env.versions : {};
    process.stdout.write(JSON.stringify({
        output_shape: [n].concat(outTail),
        seconds: Number(seconds.toFixed(6)),
        load_seconds: Number(loadSeconds.toFixed(6)),
        input_name: inputName,
        input_shape: [n].concat(tail),
        output_name: outputName,
        onnxruntime: versions.node || versions.common || null,
    }) + '\n');
}

main().catch((e) => fail(1, message(e)));
