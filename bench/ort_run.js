#!/usr/bin/env node
// Runs an ONNX model with ONNX Runtime (CPU): the reference for sdc's model
// tests and the peer in benchmarks.
//   node ort_run.js MODEL.onnx --input NAME=FILE.npy... [--output-dir DIR]
//        [--threads N] [--iterations N] [--warmup N]
// Writes outputs as DIR/<name>.npy; with --iterations prints JSON (median_ms).
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

const NPY_TYPES = { '<f4': 'float32', '<f8': 'float64', '<i8': 'int64', '<i4': 'int32', '|b1': 'bool', '|u1': 'uint8', '|i1': 'int8' };
const ARRAYS = { float32: Float32Array, float64: Float64Array, int64: BigInt64Array, int32: Int32Array, bool: Uint8Array, uint8: Uint8Array, int8: Int8Array };

function readNpy(file) {
  const buf = fs.readFileSync(file);
  if (buf.toString('latin1', 0, 6) !== '\x93NUMPY') throw new Error(`${file}: not a .npy file`);
  const major = buf[6];
  const hlen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const hoff = major === 1 ? 10 : 12;
  const header = buf.toString('latin1', hoff, hoff + hlen);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map(s => s.trim()).filter(s => s).map(Number);
  const type = NPY_TYPES[descr];
  if (!type) throw new Error(`${file}: unsupported dtype ${descr}`);
  const data = buf.subarray(hoff + hlen);
  const Arr = ARRAYS[type];
  const copy = new Uint8Array(data.length);
  copy.set(data);
  return new ort.Tensor(type, new Arr(copy.buffer), shape);
}

function writeNpy(file, tensor) {
  const descr = Object.keys(NPY_TYPES).find(k => NPY_TYPES[k] === tensor.type);
  const shape = tensor.dims.length === 1 ? `(${tensor.dims[0]},)` : `(${tensor.dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  while ((10 + header.length + 1) % 64) header += ' ';
  header += '\n';
  const pre = Buffer.alloc(10);
  pre.write('\x93NUMPY', 0, 'latin1');
  pre[6] = 1; pre[7] = 0;
  pre.writeUInt16LE(header.length, 8);
  const data = Buffer.from(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength);
  fs.writeFileSync(file, Buffer.concat([pre, Buffer.from(header, 'latin1'), data]));
}

async function main() {
  const args = process.argv.slice(2);
  if (!args.length || args[0] === '--help') {
    console.log('usage: node ort_run.js MODEL.onnx --input NAME=FILE.npy... [--output-dir DIR] [--threads N] [--iterations N] [--warmup N]');
    process.exit(args.length ? 0 : 2);
  }
  const model = args[0];
  const feeds = {};
  let outDir = null, threads = 0, iterations = 0, warmup = 3;
  for (let i = 1; i < args.length; i++) {
    const a = args[i];
    if (a === '--input') { const [n, f] = args[++i].split('='); feeds[n] = readNpy(f); }
    else if (a === '--output-dir') outDir = args[++i];
    else if (a === '--threads') threads = Number(args[++i]);
    else if (a === '--iterations') iterations = Number(args[++i]);
    else if (a === '--warmup') warmup = Number(args[++i]);
    else throw new Error(`unknown option ${a}`);
  }
  const opts = { executionProviders: ['cpu'], graphOptimizationLevel: 'all', interOpNumThreads: 1 };
  if (threads > 0) opts.intraOpNumThreads = threads;
  const session = await ort.InferenceSession.create(model, opts);
  let results = await session.run(feeds);
  if (outDir) {
    fs.mkdirSync(outDir, { recursive: true });
    for (const name of session.outputNames) writeNpy(path.join(outDir, `${name}.npy`), results[name]);
  }
  if (iterations > 0) {
    for (let i = 0; i < warmup; i++) await session.run(feeds);
    const times = [];
    for (let i = 0; i < iterations; i++) {
      const t0 = process.hrtime.bigint();
      results = await session.run(feeds);
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    times.sort((a, b) => a - b);
    console.log(JSON.stringify({ runtime: 'onnxruntime-node', version: require('onnxruntime-node/package.json').version,
      iterations, threads, median_ms: times[Math.floor(times.length / 2)], min_ms: times[0] }));
  }
}

main().catch(e => { console.error(`ort_run: error: ${e.message}`); process.exit(1); });
