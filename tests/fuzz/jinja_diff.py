#!/usr/bin/env python3
"""jinja_diff.py: differential check of the C Jinja engine against Python Jinja2 (as transformers
sets it up, tests/chat/hf_jinja.py) over a directory of templates, typically a libFuzzer corpus
of fuzz_jinja_libfuzzer (meson -Dfuzz=true) or the real templates.

usage: jinja_diff.py BUILD_DIR TEMPLATE_DIR

Renders every UTF-8 file of TEMPLATE_DIR in both engines against the fuzz conversation and prints
how many render in both and how many of those are byte-identical, then every disagreement except
those Python cannot make reproducible or that lie outside the engine's documented range: printed
object addresses (<generator object ... at 0x...>, bound methods), integers beyond 64 bits, and
renders the C side stopped at the fuzz limits.
Exit status 1 when a disagreement remains.
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "chat"))
import hf_jinja  # noqa: E402

UNMATCHABLE = re.compile(r" at 0x[0-9a-f]+>|<bound method |<built-in method |\d{20,}")
LIMIT = re.compile(r"nested deeper than|loop iterations and calls|output larger than|memory limit")


def main():
    build, tdir = sys.argv[1:3]
    exe = os.path.join(build, "tests", "fuzz", "jinja_diff")
    names, srcs = [], []
    for f in sorted(os.listdir(tdir)):
        try:
            with open(os.path.join(tdir, f), encoding="utf-8") as fh:
                s = fh.read()
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        if "\0" not in s:
            names.append(f)
            srcs.append(s)
    path = os.path.join(build, "jinja_diff_inputs.json")
    with open(path, "w") as fh:
        json.dump(srcs, fh)
    ctx = json.loads(subprocess.run([exe, "--vars"], capture_output=True, text=True,
                                    check=True).stdout)
    c_lines = subprocess.run([exe, path], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    os.environ["TD_CHAT_NOW"] = "1700000000"
    both = same = 0
    bad = []
    for name, src, line in zip(names, srcs, c_lines):
        c = json.loads(line)
        try:
            p = {"output": hf_jinja.compile_template(src).render(**ctx)}
        except Exception as e:  # noqa: BLE001
            p = {"error": "%s: %s" % (type(e).__name__, e)}
        if "output" in p and UNMATCHABLE.search(p["output"]):
            continue
        if "error" in p and UNMATCHABLE.search(src):
            continue
        if LIMIT.search(c.get("error", "")):  # the fuzz limits are tighter than Python's
            continue
        if "output" in c and "output" in p:
            both += 1
            same += c["output"] == p["output"]
            if c["output"] != p["output"]:
                bad.append((name, c["output"][:200], p["output"][:200]))
        elif ("output" in c) != ("output" in p):
            bad.append((name, c.get("error", c.get("output", ""))[:200],
                        p.get("error", p.get("output", ""))[:200]))
    print("%d templates, %d render in both, %d of those identical; %d disagreements" %
          (len(srcs), both, same, len(bad)))
    for name, c, p in bad:
        print("  %s\n    C:      %r\n    Python: %r" % (name, c, p))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
