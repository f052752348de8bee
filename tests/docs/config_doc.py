#!/usr/bin/python3
"""config_doc.py: docs/configuration.md lists every option of every daemon, as --help says.

Usage: config_doc.py SOURCE_ROOT BUILD_DIR [--write]

Renders each daemon's `--help` option list as a Markdown table and compares it with the block
between `<!-- options:begin -->` and `<!-- options:end -->` in docs/configuration.md; --write
replaces the block. A test runs the check, so the page cannot drift from the option tables.
"""
import os
import re
import subprocess
import sys

DAEMONS = [("tandem-router", "router", "TANDEM_ROUTER"),
           ("tandem-prefill", "prefill", "TANDEM_PREFILL"),
           ("tandem-decode", "decode", "TANDEM_DECODE")]


def options(exe):
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    lines = out.split("\n")
    i = next(k for k, l in enumerate(lines) if l.startswith("Options"))
    opts, cur = [], None
    for l in lines[i + 1:]:
        m = re.match(r"  --([\w.]+)=(\w+)$", l)
        if m:
            cur = [m.group(1), m.group(2), ""]
            opts.append(cur)
        elif cur and l.startswith("      "):
            cur[2] = (cur[2] + " " + l.strip()).strip()
    rows = []
    for name, typ, text in opts:
        m = re.search(r" \(default: (.*)\)$", text)
        default = m.group(1) if m else ""
        if m:
            text = text[:m.start()]
        rows.append((name, typ, default, text))
    return rows


def render(build):
    out = []
    for exe, sub, env in DAEMONS:
        out.append("### %s\n" % exe)
        out.append("Environment: `%s_<SECTION>_<KEY>` (for example `%s_%s`).\n" %
                   (env, env, "HTTP_LISTEN" if sub != "router" else "PLACEMENT_POLICY"))
        out.append("| option | type | default | meaning |")
        out.append("| --- | --- | --- | --- |")
        for name, typ, default, text in options(os.path.join(build, sub, exe)):
            esc = lambda s: s.replace("|", "\\|")
            out.append("| `%s` | %s | %s | %s |" % (name, typ, "`%s`" % esc(default)
                                                   if default else "", esc(text)))
        out.append("")
    return "\n".join(out)


def main():
    src, build = sys.argv[1], sys.argv[2]
    path = os.path.join(src, "docs", "configuration.md")
    doc = open(path).read()
    begin, end = "<!-- options:begin -->\n", "<!-- options:end -->"
    i, j = doc.find(begin), doc.find(end)
    if i < 0 or j < 0:
        sys.exit("FAIL: %s has no options block" % path)
    want = render(build)
    if "--write" in sys.argv:
        open(path, "w").write(doc[:i + len(begin)] + want + doc[j:])
        print("wrote", path)
        return
    have = doc[i + len(begin):j]
    if have != want:
        import difflib
        sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                   "docs/configuration.md", "--help"))
        sys.exit("FAIL: docs/configuration.md differs from the daemons' --help; run "
                 "tests/docs/config_doc.py SOURCE BUILD --write")
    print("OK: docs/configuration.md lists every option of %d daemons" % len(DAEMONS))


if __name__ == "__main__":
    main()
