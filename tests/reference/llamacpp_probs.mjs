// llamacpp_probs.mjs: llama.cpp's (node-llama-cpp's prebuilt CPU build) next-token
// probabilities at every position of a token-id sequence, at temperature 1 with no truncation,
// printed as one JSON array of [vocab] arrays. Used by test_quant.py.
//
// usage: node llamacpp_probs.mjs NODE_MODULES_DIR MODEL.gguf 1,2,3
import path from "node:path";
import {pathToFileURL} from "node:url";

const [modulesDir, modelPath, idsStr] = process.argv.slice(2);
const {getLlama} = await import(
    pathToFileURL(path.join(modulesDir, "node-llama-cpp", "dist", "index.js")).href);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const ctx = await model.createContext({contextSize: 256, threads: 1});
const seq = ctx.getSequence();
const ids = idsStr.split(",").map(Number);
const opts = {temperature: 1, topK: 0, topP: 1, minP: 0};
const res = await seq.controlledEvaluate(
    ids.map((t) => [t, {generateNext: {probabilities: true, options: opts}}]));
const n = model.tokens.vocabSize ?? model.fileInfo?.metadata?.llama?.vocab_size;
const out = res.map((r) => {
    const p = new Array(n).fill(0);
    for (const [tok, prob] of r.next.probabilities)
        p[tok] = prob;
    return p;
});
console.log(JSON.stringify(out));
await ctx.dispose();
await model.dispose();
