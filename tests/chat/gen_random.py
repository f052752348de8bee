#!/usr/bin/env python3
"""gen_random.py: write tests/chat/random.json, conversations made at random (fixed seed) from
fragments that stress the templates' string handling: <think> and </think> in odd places, tool
responses, Unicode and ASCII whitespace at the edges, template-looking text, and tool calls
(with random arguments) and tool definitions.

usage: /usr/bin/python3 tests/chat/gen_random.py   (rewrites tests/chat/random.json)
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "random.json")
COUNT = 80
SEED = 20261130

FRAGMENTS = [
    "", "a", "hello world", "\n", "\n\n", " ", "\t", "  x  ", "<think>", "</think>",
    "<tool_response>", "</tool_response>", "\u3000", "\u00a0", "\u2028", "é", "日本", "😀", "{{ bos_token }}", "<|im_end|>", "<|eot_id|>", "<｜User｜>",
    "\r\n", "\\n", "\"q\"",
]
# whitespace Python's str.strip() treats unlike other engines (U+0085, U+001F strip; U+FEFF not)
RARE = ["\u0085", "\ufeff", "\u001f"]
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {
        "word": {"type": "string", "description": "the word"},
        "limit": {"type": "integer", "default": 3}}, "required": ["word"]}}}]
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
            if rng.random() < 0.25:
                args = {"word": text(rng)}
                if rng.random() < 0.5:
                    args["limit"] = rng.choice([0, 1, 2.5, -7, None, True])
                m["tool_calls"] = [{"id": "call_%d_%d" % (i, k), "type": "function",
                                    "function": {"name": "lookup",
                                                 "arguments": json.dumps(args, ensure_ascii=False)}}
                                   for k in range(rng.randint(1, 2))]
                if rng.random() < 0.5:
                    m["content"] = None
        if m["role"] == "tool" and rng.random() < 0.5:
            m["tool_call_id"] = "call_%d_0" % i
        msgs.append(m)
    c = {"name": "random %02d" % i, "messages": msgs}
    if rng.random() < 0.3:
        c["tools"] = TOOLS
    if rng.random() < 0.5:
        c["add_generation_prompt"] = True
    r = rng.random()
    if r < 0.3:
        c["enable_thinking"] = False
    elif r < 0.45:
        c["enable_thinking"] = True
    return c


def main():
    rng = random.Random(SEED)
    convs = [conversation(rng, i) for i in range(COUNT)]
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=True) for c in convs))
        f.write("\n]\n")
    print("wrote %s: %d conversations, %d with tools, %d with tool calls" %
          (OUT, len(convs), sum(1 for c in convs if "tools" in c),
           sum(1 for c in convs if any("tool_calls" in m for m in c["messages"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
