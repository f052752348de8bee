#!/usr/bin/python3
"""test_kvhash_cli.py: `tandem kvhash` across processes.

Every case of tests/data/kvhash-v1.txt is hashed by two separate `tandem kvhash` processes with
different environments, working directories and flag spellings, then by a third, "restarted"
process after both exited; all three must print the same lines and match the vectors. The
--model form is run the same way against a tiny generated model, and must agree with
--fingerprint of the fingerprint it prints. Malformed --ids lists are refused naming the flag.

usage: test_kvhash_cli.py TANDEM SOURCE_ROOT
"""
import os
import subprocess
import sys
import tempfile


def parse_vectors(path):
    cases, cur = [], None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            key, _, val = line.partition(" ")
            if key == "case":
                cur = {"name": val, "hashes": []}
            elif key == "hash":
                idx, h = val.split()
                assert int(idx) == len(cur["hashes"]), line
                cur["hashes"].append(h)
            elif key == "end":
                assert int(cur["blocks"]) == len(cur["hashes"]), cur["name"]
                cases.append(cur)
                cur = None
            else:
                cur[key] = val
    return cases


def expected(case):
    out = ["version 1", "fingerprint " + case["fingerprint"], "root " + case["root"]]
    out += ["block %d %s" % (i, h) for i, h in enumerate(case["hashes"])]
    return "\n".join(out) + "\n"


def run(tandem, args, env, cwd):
    p = subprocess.run([tandem, "kvhash"] + args, env=env, cwd=cwd, capture_output=True,
                       text=True, timeout=60)
    if p.returncode != 0:
        sys.exit("tandem kvhash %s: exit %d: %s" % (" ".join(args)[:200], p.returncode, p.stderr))
    return p.stdout


def main():
    tandem, src = os.path.abspath(sys.argv[1]), sys.argv[2]
    vec = os.path.join(src, "tests", "data", "kvhash-v1.txt")
    if not os.path.exists(vec):
        print("%s missing: skipped" % vec)
        sys.exit(77)
    cases = parse_vectors(vec)
    assert len(cases) >= 6, len(cases)
    with tempfile.TemporaryDirectory() as tmp:
        d1, d2 = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        os.mkdir(d1)
        os.mkdir(d2)
        env1 = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
        env2 = dict(os.environ, LANG="de_DE.UTF-8", LC_ALL="tr_TR.UTF-8", TZ="Asia/Kolkata",
                    MALLOC_PERTURB_="165", TD_LOG_LEVEL="debug", HOME=d2,
                    XXH_SEED_NOT_USED=os.urandom(8).hex())
        for c in cases:
            salt = c["salt"]
            toks = "" if c["tokens"] == "-" else c["tokens"]
            a1 = ["--fingerprint", c["fingerprint"], "--block-size", c["block_size"], "--ids", toks]
            if salt != "-":
                a1 += ["--tenant-hex", salt]
            # other spellings: flag=value, another order, upper-case hex, the salt as text
            a2 = ["--ids=" + toks, "--block-size=" + c["block_size"],
                  "--fingerprint=" + c["fingerprint"].upper()]
            if salt != "-":
                raw = bytes.fromhex(salt)
                if all(0x21 <= b < 0x7f for b in raw):
                    a2 += ["--tenant", raw.decode()]
                else:
                    a2 += ["--tenant-hex=" + salt.upper()]
            want = expected(c)
            # two live processes at once, different environments and directories
            p1 = subprocess.Popen([tandem, "kvhash"] + a1, env=env1, cwd=d1,
                                  stdout=subprocess.PIPE, text=True)
            p2 = subprocess.Popen([tandem, "kvhash"] + a2, env=env2, cwd=d2,
                                  stdout=subprocess.PIPE, text=True)
            o1, _ = p1.communicate(timeout=60)
            o2, _ = p2.communicate(timeout=60)
            assert p1.returncode == 0 and p2.returncode == 0, c["name"]
            o3 = run(tandem, a1, env1, d1)  # restarted, after both exited
            for who, o in (("process 1", o1), ("process 2", o2), ("restarted", o3)):
                if o != want:
                    sys.exit("%s: %s printed\n%s\nwant\n%s" % (c["name"], who, o, want))
            print("ok %s (%d blocks)" % (c["name"], len(c["hashes"])))

        # --model: the fingerprint from td_model_load + td_kv_layout_init, stable across runs
        model = os.path.join(tmp, "model")
        subprocess.run([tandem, "mkmodel", "--arch", "llama", "--out", model], check=True,
                       env=env1, capture_output=True, timeout=120)
        ids = ",".join(str(i) for i in range(1, 40))
        am = ["--model", model, "--block-size", "16", "--ids", ids, "--tenant", "acme"]
        m1, m2 = run(tandem, am, env1, d1), run(tandem, am, env2, d2)
        m3 = run(tandem, am, env1, d2)
        assert m1 == m2 == m3, (m1, m2, m3)
        fp = m1.splitlines()[1].split()[1]
        assert len(fp) == 32, m1
        mf = run(tandem, ["--fingerprint", fp, "--block-size", "16", "--ids", ids,
                          "--tenant", "acme"], env2, d1)
        assert mf == m1, (mf, m1)
        assert len(m1.splitlines()) == 3 + 2, m1
        other = run(tandem, ["--model", model, "--block-size", "8", "--ids", ids], env1, d1)
        assert other.splitlines()[1] != m1.splitlines()[1], "block size not in the fingerprint"
        print("ok --model (fingerprint %s)" % fp)

        # strict parsing: each malformed list is refused, naming --ids
        for bad in ("3,,4", "1,", ",1", "1,x", "1, 2", "4294967296", "1;2", "+1", "-", "0x10",
                    "2147483648", "-2147483649"):
            p = subprocess.run([tandem, "kvhash", "--fingerprint", "00" * 16, "--block-size", "4",
                                "--ids", bad], capture_output=True, text=True, env=env1)
            if p.returncode != 2 or "--ids" not in p.stderr:
                sys.exit("--ids %r: exit %d, stderr %r" % (bad, p.returncode, p.stderr))
        # a leading zero is decimal, not octal: 010 hashes as 10
        base = ["kvhash", "--fingerprint", "00" * 16, "--block-size", "2"]
        z = [subprocess.run([tandem] + base + ["--ids", ids], capture_output=True, text=True,
                            env=env1) for ids in ("010,-5", "10,-5", "8,-5")]
        assert all(p.returncode == 0 for p in z), [p.stderr for p in z]
        assert z[0].stdout == z[1].stdout != z[2].stdout, "010 was not read as decimal 10"
        for args in (["--block-size", "4", "--ids", "1"],  # no fingerprint or model
                     ["--fingerprint", "abc", "--block-size", "4", "--ids", "1"],
                     ["--fingerprint", "00" * 16, "--block-size", "0", "--ids", "1"]):
            p = subprocess.run([tandem, "kvhash"] + args, capture_output=True, text=True, env=env1)
            assert p.returncode != 0, args
        h = subprocess.run([tandem, "kvhash", "--help"], capture_output=True, text=True)
        assert h.returncode == 0 and "--fingerprint" in h.stdout and "restart" in h.stdout
        print("ok strict parsing")


main()
