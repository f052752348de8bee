#!/usr/bin/env python3
"""render_chat.py: render chat-template fixtures with Python Jinja2 exactly as Hugging Face
transformers' apply_chat_template does (hf_jinja.py), with the real chat_template and special
tokens of each tokenizer_config.json given on the command line.

This is the reference for common/text/chat.c and the Jinja engine (tests/chat/README.md).

usage: render_chat.py FAMILY=TOKENIZER_CONFIG.json... -- FIXTURES.json...
Writes one JSON object per line: {"family", "name", "output"} or {"family", "name", "error",
"raised"} ("raised" holds raise_exception's message when the template raised).
The clock of strftime_now is TD_CHAT_NOW (unix seconds) when set.
"""
import json
import os
import sys

import jinja2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_jinja  # noqa: E402


def load_family(path):
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    src = cfg.get("chat_template")
    tools_src = None
    if isinstance(src, list):
        named = {e["name"]: e["template"] for e in src}
        src, tools_src = named["default"], named.get("tool_use")
    return {
        "template": hf_jinja.compile_template(src),
        "tools_template": hf_jinja.compile_template(tools_src) if tools_src else None,
        "special": hf_jinja.special_tokens_map(cfg),
    }


def normalize(messages):
    """What the router does to OpenAI messages before rendering (as vLLM does): text parts are
    joined into one string, tool call arguments are parsed from their JSON text, and a null
    content beside tool calls becomes ''."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        if m.get("content") is None and m.get("tool_calls"):
            m["content"] = ""
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"])
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            args = fn.get("arguments")
            if args is None or args == "":
                fn["arguments"] = {}
            elif isinstance(args, str):
                fn["arguments"] = json.loads(args)
        out.append(m)
    return out


def main():
    args = sys.argv[1:]
    if "--" not in args:
        sys.stderr.write("usage: render_chat.py FAMILY=CONFIG.json... -- FIXTURES.json...\n")
        return 2
    cut = args.index("--")
    fams = {}
    for spec in args[:cut]:
        name, path = spec.split("=", 1)
        fams[name] = load_family(path)
    out = sys.stdout
    for file in args[cut + 1:]:
        with open(file, encoding="utf-8") as f:
            convs = json.load(f)
        for c in convs:
            for family in c.get("families", list(fams)):
                if family not in fams:
                    continue
                fam = fams[family]
                kwargs = dict(c.get("kwargs", {}))
                if "enable_thinking" in c:
                    kwargs["enable_thinking"] = c["enable_thinking"]
                tools = c.get("tools")
                tpl = fam["tools_template"] if tools is not None and fam["tools_template"] \
                    else fam["template"]
                rec = {"family": family, "name": c["name"]}
                try:
                    rec["output"] = hf_jinja.render(
                        tpl, normalize(c["messages"]), tools=tools,
                        add_generation_prompt=bool(c.get("add_generation_prompt", False)),
                        special=fam["special"], **kwargs)
                except jinja2.exceptions.TemplateError as e:
                    rec["error"] = "%s: %s" % (type(e).__name__, e)
                    if type(e) is jinja2.exceptions.TemplateError:
                        rec["raised"] = str(e)
                except Exception as e:  # noqa: BLE001 - any failure: C must fail too
                    rec["error"] = "%s: %s" % (type(e).__name__, e)
                out.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
