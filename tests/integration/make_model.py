#!/usr/bin/python3
"""make_model.py: write a tiny test model with `tandem mkmodel` once (build step for the tests).

Usage: make_model.py TANDEM ARCH TOKENIZER_DIR OUT_DIR STAMP
Writes OUT_DIR atomically (a temporary directory renamed into place), then touches STAMP.
"""
import os
import shutil
import subprocess
import sys

tandem, arch, tok, out, stamp = sys.argv[1:6]
tmp = out + ".tmp%d" % os.getpid()
shutil.rmtree(tmp, ignore_errors=True)
subprocess.run([tandem, "mkmodel", "--arch", arch, "--preset", "tiny", "--seed", "3",
                "--tokenizer", tok, "--out", tmp], check=True, stdout=subprocess.DEVNULL)
shutil.rmtree(out, ignore_errors=True)
os.rename(tmp, out)
with open(stamp, "w") as f:
    f.write(out + "\n")
