#!/usr/bin/env python3
"""gen_random.py: write tests/chat/random.json, conversations made at random (fixed seed) from
fragments that stress the templates' string handling: <think> and </think> in odd places, tool
responses, Unicode and ASCII whitespace at the edges, template-looking text.

The "node_differs" marks come from the two reference engines themselves: the script renders
every conversation with render_chat.py (Python Jinja2) and render_chat.js (@huggingface/jinja)
and marks the families where they disagree. Nothing here looks at the C renderer.

usage: /usr/bin/python3 tests/chat/gen_random.py   (rewrites tests/chat/random.json)
"""
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "random.json")
COUNT = 80
SEED = 20261130

FRAGMENTS = [
    "", "a", "hello world", "\n", "\n\n", " ", "\t", "  x  ", "<think>", "</think>",
    "<tool_response>", "</tool_response>", "\u3000", "\u00a0", "\u2028", "é", "日本", "😀", "{{ bos_token }}", "<|im_end|>", "<|eot_id|>", "<｜User｜>",
    "\r\n", "\\n", "\"q\"",
]
# whitespace that only one engine strips (Python: U+0085, U+001F; @huggingface/jinja: U+FEFF):
# rare, so that most conversations are compared with both engines
RARE = ["\u0085", "\ufeff", "\u001f"]
ROLES = ["user", "user", "assistant", "assistant", "system", "tool"]


def fragment(rng):
    return rng.choice(RARE) if rng.random() < 0.03 else rng.choice(FRAGMENTS)


def text(rng):
    return "".join(fragment(rng) for _ in range(rng.randint(0, 6)))


def conversation(rng, i):
    msgs = []
    for _ in range(rng.randint(1, 7)):
        m = {"role": rng.choice(ROLES), "content": text(rng)}
        if m["role"] == "user" and rng.random() < 0.15:
            m["content"] = "<tool_response>" + m["content"] + "</tool_response>"
        if m["role"] == "assistant":
            r = rng.random()
            if r < 0.2:
                m["reasoning_content"] = text(rng)
            elif r < 0.3:
                m["reasoning_content"] = None
        msgs.append(m)
    c = {"name": "random %02d" % i, "messages": msgs}
    if rng.random() < 0.5:
        c["add_generation_prompt"] = True
    r = rng.random()
    if r < 0.3:
        c["enable_thinking"] = False
    elif r < 0.45:
        c["enable_thinking"] = True
    return c


def render(cmd):
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    recs = [json.loads(line) for line in res.stdout.split("\n") if line]  # not splitlines():
    return {(r["family"], r["name"]): r for r in recs}                    # U+2028 is not a break


def main():
    rng = random.Random(SEED)
    convs = [conversation(rng, i) for i in range(COUNT)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(convs, f, ensure_ascii=False)
        tmp = f.name
    try:
        py = render([sys.executable, os.path.join(HERE, "render_chat.py"), tmp])
        node = render([os.environ.get("TD_NODE", "node"),
                       os.path.join(HERE, "..", "node", "render_chat.js"), tmp])
    finally:
        os.unlink(tmp)
    for c in convs:
        differs = [fam for (fam, name), r in py.items()
                   if name == c["name"] and r.get("output") != node[(fam, name)].get("output")]
        if differs:
            c["node_differs"] = sorted(differs)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=True) for c in convs))
        f.write("\n]\n")
    print("wrote %s: %d conversations, %d with node_differs" %
          (OUT, len(convs), sum(1 for c in convs if "node_differs" in c)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
