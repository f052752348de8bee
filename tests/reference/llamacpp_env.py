"""llamacpp_env.py: whether llama.cpp (node-llama-cpp under node) can run here, for the tests that
compare against it.

node-llama-cpp needs Node.js 20 or newer; Debian 12's own nodejs is 18, where scripts/install-deps
installs the packages without their install scripts and these comparisons are skipped.
"""
import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = os.environ.get("TD_NODE_MODULES") or os.path.join(HERE, "..", "node", "node_modules")


def missing():
    """None when llama.cpp can run, else why not (for a SKIP line)."""
    if not os.path.exists(os.path.join(MODULES, "node-llama-cpp", "dist", "index.js")):
        return "node-llama-cpp not installed under %s" % MODULES
    node = shutil.which("node")
    if node is None:
        return "no node on PATH"
    v = subprocess.run([node, "-p", "process.versions.node"], capture_output=True, text=True)
    try:
        major = int(v.stdout.strip().split(".")[0])
    except ValueError:
        return "cannot read node's version: %r" % (v.stdout + v.stderr)
    if major < 20:
        return "node-llama-cpp needs Node.js 20 or newer; this node is %s" % v.stdout.strip()
    return None
