#!/usr/bin/python3
"""test_generate_cli.py: `tandem generate --json` and its --prompt-ids checks, on a test model.

The JSON object must parse and agree with the text output (same ids, same finish), with `tandem
tokenize` (prompt_ids) and `tandem detokenize` (text); every generated token has a logprob printed
at float32 precision (the printed number reads back to the same float32 and prints the same),
--logprobs N gives N alternatives, best first, and under greedy sampling the sampled token is the
first alternative. Malformed --prompt-ids and --stop-ids lists are refused with exit status 2 and a
message naming the flag and the element; ids outside the vocabulary with status 1 and a message in
the user's terms (which token, its value, the vocabulary's range).

usage: test_generate_cli.py TANDEM MODEL_DIR
"""
import json
import struct
import subprocess
import sys

tandem, model = sys.argv[1:3]
fails = 0


def check(name, cond, detail=""):
    global fails
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else ": " + str(detail)))
    if not cond:
        fails += 1


def run(*args):
    return subprocess.run([tandem, *args], capture_output=True, text=True, timeout=120)


def f32_exact(s):
    """Whether the printed number s is a float32 printed with all its digits (%.9g)."""
    v = struct.unpack("f", struct.pack("f", float(s)))[0]
    return "%.9g" % v == s


def gen_json(*args):
    r = run("generate", model, *args, "--json")
    if r.returncode != 0:
        raise RuntimeError("generate --json %s: rc %d: %s" % (args, r.returncode, r.stderr))
    lines = r.stdout.splitlines()
    check("one line of output %s" % (args,), len(lines) == 1, r.stdout)
    return json.loads(lines[0]), lines[0]


# text prompt, greedy, with alternatives
out, raw = gen_json("--prompt", "Hello world", "--max-tokens", "6", "--ignore-eos",
                    "--logprobs", "3")
keys = ["prompt_ids", "ids", "text", "finish_reason", "logprobs", "timings"]
check("keys", list(out) == keys, list(out))
want_prompt = [int(x) for x in run("tokenize", "--tokenizer", model, "Hello world").stdout.split()]
check("prompt_ids are the tokenizer's", out["prompt_ids"] == want_prompt,
      (out["prompt_ids"], want_prompt))
check("6 ids", len(out["ids"]) == 6, out["ids"])
check("finish length", out["finish_reason"] == "length", out["finish_reason"])
detok = run("detokenize", "--tokenizer", model, ",".join(map(str, out["ids"]))).stdout
check("text is the detokenized ids", out["text"] == detok.rstrip("\n"), (out["text"], detok))
lp = out["logprobs"]
check("a logprob per token", [x["id"] for x in lp] == out["ids"], lp)
check("3 alternatives each", all(len(x["top"]) == 3 for x in lp), lp)
check("alternatives best first",
      all(a["logprob"] >= b["logprob"] for x in lp for a, b in zip(x["top"], x["top"][1:])), lp)
check("greedy: sampled token is the best", all(x["top"][0]["id"] == x["id"] and
                                                x["top"][0]["logprob"] == x["logprob"] for x in lp))
check("logprobs are <= 0", all(x["logprob"] <= 0 for x in lp), lp)
# full precision: every printed logprob is a float32 with all its digits
nums = [t.split(",")[0].split("}")[0] for t in raw.split('"logprob": ')[1:]]
check("logprobs at float32 precision", len(nums) == 6 * 4 and all(f32_exact(n) for n in nums),
      nums)
t = out["timings"]
check("timings", t["prefill_tokens"] == len(want_prompt) and t["decode_tokens"] == 5 and
      t["prefill_s"] > 0 and t["decode_s"] > 0, t)

# the same request in text mode gives the same ids and finish
r = run("generate", model, "--prompt", "Hello world", "--max-tokens", "6", "--ignore-eos")
text_ids = [l.split(":", 1)[1].strip() for l in r.stdout.splitlines() if l.startswith("output ids:")]
check("text mode agrees", text_ids == [",".join(map(str, out["ids"]))], (text_ids, out["ids"]))
check("text mode finish", "finish: length" in r.stdout.splitlines(), r.stdout)

# text mode with --logprobs 0: one line per generated token with its logprob and no alternatives,
# and the logprobs are the --json ones (printed to 4 decimals)
r = run("generate", model, "--prompt", "Hello world", "--max-tokens", "6", "--ignore-eos",
        "--logprobs", "0")
tok_lines = [l for l in r.stdout.splitlines() if l.startswith("token ")]
check("--logprobs 0 prints a line per token", len(tok_lines) == 6, r.stdout)
check("--logprobs 0: no alternatives", all(l.endswith(" top:") for l in tok_lines), tok_lines)
check("--logprobs 0: the --json logprobs",
      [(int(l.split()[1]), round(float(l.split()[3]), 4)) for l in tok_lines] ==
      [(x["id"], round(x["logprob"], 4)) for x in lp], (tok_lines, lp))

# ids prompt, seeded sampling, no --logprobs: logprobs still given, no alternatives
out, _ = gen_json("--prompt-ids", ",".join(map(str, want_prompt)), "--max-tokens", "4",
                  "--temperature", "0.8", "--seed", "7", "--ignore-eos")
check("prompt-ids echoed", out["prompt_ids"] == want_prompt, out["prompt_ids"])
check("no alternatives without --logprobs", all(x["top"] == [] for x in out["logprobs"]) and
      len(out["logprobs"]) == 4, out["logprobs"])
out2, _ = gen_json("--prompt-ids", ",".join(map(str, want_prompt)), "--max-tokens", "4",
                   "--temperature", "0.8", "--seed", "7", "--ignore-eos")
check("seeded output repeats", out2["ids"] == out["ids"], (out["ids"], out2["ids"]))

# a stop id ends with finish_reason stop, the stop id last
first = out["ids"][0]
out, _ = gen_json("--prompt-ids", ",".join(map(str, want_prompt)), "--max-tokens", "4",
                  "--temperature", "0.8", "--seed", "7", "--stop-ids", str(first))
check("stop id", out["ids"] == [first] and out["finish_reason"] == "stop", out)

# strict --prompt-ids / --stop-ids
for flag in ("--prompt-ids", "--stop-ids"):
    for bad, what in (("3,,4", 'element 2 is empty'), ("1,", "element 2 is empty"),
                      (",1", "element 1 is empty"), (" 1", 'element 1 " 1" is not a token id'),
                      ("1 ", 'element 1 "1 " is not a token id'),
                      ("+1", 'element 1 "+1" is not a token id'),
                      ("-1", 'element 1 "-1" is not a token id'),
                      ("0x10", 'element 1 "0x10" is not a token id'),
                      ("1,2147483648", 'element 2 "2147483648" is not a token id'),
                      ("", "no token ids")):
        args = ["--prompt-ids", "1"] if flag == "--stop-ids" else []
        r = run("generate", model, *args, flag, bad, "--json")
        check("%s %r refused" % (flag, bad), r.returncode == 2 and (flag + ": " + what) in r.stderr
              and r.stdout == "", (r.returncode, r.stderr))

# ids outside the vocabulary, in the user's terms
vocab = json.load(open(model + "/config.json"))["vocab_size"]
r = run("generate", model, "--prompt-ids", "5,6,%d" % vocab, "--json")
want = "--prompt-ids: token 3 is %d; the vocabulary has ids 0..%d" % (vocab, vocab - 1)
check("out-of-vocabulary prompt id", r.returncode == 1 and want in r.stderr, r.stderr)
r = run("generate", model, "--prompt-ids", "5", "--stop-ids", "999999999", "--json")
want = "--stop-ids: token 1 is 999999999; the vocabulary has ids 0..%d" % (vocab - 1)
check("out-of-vocabulary stop id", r.returncode == 1 and want in r.stderr, r.stderr)
r = run("generate", model, "--prompt-ids", "5,%d" % (vocab - 1), "--max-tokens", "1", "--json")
check("largest id accepted", r.returncode == 0, r.stderr)

print("%d failed" % fails)
sys.exit(1 if fails else 0)
