// llamacpp_bench.mjs: llama.cpp's CPU throughput (node-llama-cpp's prebuilt build) on a GGUF file,
// for bench/engine.sh: prefill tokens/s (the whole prompt in one batch) and greedy decode tokens/s
// at batch 1 (one sequence, after a short prompt), with a fixed thread count. Prints two lines:
//   llama.cpp prefill: N tokens in S s: X tokens/s
//   llama.cpp decode batch  1: N steps in S s (CPU C s): X tokens/s
// where C is the process's CPU time over the decode (process.cpuUsage: every thread, llama.cpp's
// included), which leaves out the time the threads waited for a core on a loaded machine.
//
// usage: node llamacpp_bench.mjs NODE_MODULES_DIR MODEL.gguf VOCAB THREADS PROMPT DECODE [PREFILLS]
// PREFILLS (default 1): the prefill runs that many times (history cleared in between, as
// bench_engine --prefills does) and the line gives the median run.
// Prompt token ids are (i * 7919 + 13) % VOCAB, the same as bench_engine's.
import path from "node:path";
import {pathToFileURL} from "node:url";

const [modulesDir, modelPath, vocabStr, threadsStr, promptStr, decodeStr, prefillsStr] =
    process.argv.slice(2);
const vocab = Number(vocabStr), threads = Number(threadsStr), nPrompt = Number(promptStr),
      nDecode = Number(decodeStr), nPrefills = Number(prefillsStr ?? 1);
if (!(vocab > 0 && threads > 0 && nPrompt >= 16 && nDecode > 0 && nPrefills >= 1)) {
    console.error("usage: node llamacpp_bench.mjs NODE_MODULES_DIR MODEL.gguf VOCAB THREADS PROMPT DECODE [PREFILLS]");
    process.exit(2);
}
const {getLlama} = await import(
    pathToFileURL(path.join(modulesDir, "node-llama-cpp", "dist", "index.js")).href);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error", maxThreads: threads});
const model = await llama.loadModel({modelPath});
const ctx = await model.createContext({
    contextSize: nPrompt + nDecode + 64,
    batchSize: nPrompt,
    sequences: 1,
    threads: {ideal: threads, min: threads},
});
const seq = ctx.getSequence();
const toks = Array.from({length: nPrompt}, (_, i) => (i * 7919 + 13) % vocab);
const now = () => Number(process.hrtime.bigint()) / 1e9;

// warm-up: page the weights in and let llama.cpp allocate its buffers
await seq.evaluateWithoutGeneratingNewTokens(toks.slice(0, 16));
await seq.clearHistory();

// prefill: the whole prompt in one batch, nPrefills times; the median run
const runs = [];
let t0, dt;
for (let r = 0; r < nPrefills; r++) {
    t0 = now();
    await seq.evaluateWithoutGeneratingNewTokens(toks);
    runs.push(now() - t0);
    await seq.clearHistory();
}
runs.sort((a, b) => a - b);
dt = runs[Math.floor(nPrefills / 2)];
console.log(`llama.cpp prefill: ${nPrompt} tokens in ${dt.toFixed(3)} s: ${(nPrompt / dt).toFixed(1)} tokens/s`);

// decode: a 16-token prompt (like bench_engine's), then nDecode greedy steps of one token each,
// timed from the first generated token (which ends the prompt's step) to the last
let n = 0, c0;
for await (const t of seq.evaluate(toks.slice(0, 16), {temperature: 0})) {
    if (n === 0) {
        t0 = now();
        c0 = process.cpuUsage();
    }
    if (++n > nDecode)
        break;
}
dt = now() - t0;
const cu = process.cpuUsage(c0), cpu = (cu.user + cu.system) / 1e6;
console.log(`llama.cpp decode batch  1: ${nDecode} steps in ${dt.toFixed(3)} s (CPU ${cpu.toFixed(3)} s): ${(nDecode / dt).toFixed(1)} tokens/s`);
await ctx.dispose();
await model.dispose();
