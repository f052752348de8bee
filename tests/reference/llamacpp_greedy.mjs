// llamacpp_greedy.mjs: greedy token ids from llama.cpp (node-llama-cpp's prebuilt CPU build) for a
// GGUF file and a token-id prompt, printed as a JSON array. Used by test_llamacpp.py.
//
// usage: node llamacpp_greedy.mjs NODE_MODULES_DIR MODEL.gguf 1,2,3 STEPS
import path from "node:path";
import {pathToFileURL} from "node:url";

const [modulesDir, modelPath, promptStr, stepsStr] = process.argv.slice(2);
const {getLlama} = await import(
    pathToFileURL(path.join(modulesDir, "node-llama-cpp", "dist", "index.js")).href);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const ctx = await model.createContext({contextSize: 256, threads: 1});
const seq = ctx.getSequence();
const prompt = promptStr.split(",").map(Number);
const out = [];
for await (const t of seq.evaluate(prompt, {temperature: 0})) {
    out.push(t);
    if (out.length >= Number(stepsStr))
        break;
}
console.log(JSON.stringify(out));
await ctx.dispose();
await model.dispose();
