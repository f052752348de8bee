#!/usr/bin/env python3
"""hf_jinja.py: Python Jinja2 set up exactly as Hugging Face transformers' apply_chat_template
sets it up (transformers/utils/chat_template_utils.py, _compile_jinja_template and
render_jinja_template), without needing transformers installed:

- ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
  extensions=[AssistantTracker, jinja2.ext.loopcontrols]); the {% generation %} block renders its
  body (AssistantTracker outside assistant-mask mode);
- filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=None, separators=None,
  sort_keys=False) with those keyword arguments exposed;
- globals raise_exception (TemplateError) and strftime_now (datetime.now().strftime); the clock
  can be pinned with TD_CHAT_NOW=<unix seconds> so tests are reproducible;
- render(messages=..., tools=..., documents=None, add_generation_prompt=..., **special_tokens_map,
  **kwargs).

The reference for common/text/jinja_*.c and chat.c (tests/chat/README.md).

usage: hf_jinja.py TEMPLATE_FILE VARS.json   prints the render of TEMPLATE_FILE with VARS
       hf_jinja.py --cases CASES.json          renders each {"name", "template", "vars"} and
                                               writes {"name", "output"} or {"name", "error"}
                                               per line (tests/unit/text/test_jinja.c)
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} ... {% endgeneration %}: outside mask mode, the body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    pinned = os.environ.get("TD_CHAT_NOW")
    now = (datetime.datetime.fromtimestamp(int(pinned)) if pinned
           else datetime.datetime.now())
    return now.strftime(fmt)


def compile_template(source):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token", "additional_special_tokens"]


def token_string(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def special_tokens_map(cfg):
    """transformers' tokenizer.special_tokens_map from tokenizer_config.json: the attributes
    that are set (truthy), as strings."""
    out = {}
    for k in SPECIAL_TOKENS:
        v = cfg.get(k)
        if k == "additional_special_tokens":
            v = [token_string(x) for x in v] if isinstance(v, list) else None
        else:
            v = token_string(v)
        if v:
            out[k] = v
    return out


def render(template, messages, tools=None, add_generation_prompt=False, special=None, **kwargs):
    return template.render(messages=messages, tools=tools, documents=None,
                           add_generation_prompt=add_generation_prompt,
                           **(special or {}), **kwargs)


def run_cases(path):
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)
    for c in cases:
        rec = {"name": c["name"]}
        try:
            rec["output"] = compile_template(c["template"]).render(**c.get("vars", {}))
        except Exception as e:  # noqa: BLE001 - the C engine must fail too
            rec["error"] = "%s: %s" % (type(e).__name__, e)
        sys.stdout.write(json.dumps(rec) + "\n")
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--cases":
        return run_cases(sys.argv[2])
    if len(sys.argv) != 3:
        sys.stderr.write("usage: hf_jinja.py TEMPLATE_FILE VARS.json\n")
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        tpl = compile_template(f.read())
    with open(sys.argv[2], encoding="utf-8") as f:
        ctx = json.load(f)
    sys.stdout.write(tpl.render(**ctx))
    return 0


if __name__ == "__main__":
    sys.exit(main())
