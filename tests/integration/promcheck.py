#!/usr/bin/python3
"""promcheck.py: a strict checker of the Prometheus text exposition format (0.0.4).

promtool (`promtool check metrics`) comes only with Debian's `prometheus` package, the whole
monitoring server, which the test machines do not install (docs/metrics.md), so the tests use
this instead. It refuses what Prometheus' own text parser refuses, and a little more:

- every line ends with "\\n"; no blank lines; comments are "# HELP name text" or "# TYPE name type"
- metric names [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* not starting "__"
- label values quoted, with only \\\\, \\" and \\n escapes; no label twice in one sample
- values are Go floats, NaN, +Inf or -Inf; no timestamps (tandem writes none)
- HELP and TYPE at most once per family, TYPE before the family's samples, a family's samples
  contiguous, every sample belongs to a TYPEd family, no series twice
- counters >= 0; histograms: only _bucket (with le), _sum and _count samples; per label set the
  le values strictly increasing, ending in +Inf, counts cumulative, +Inf bucket == _count

usage: promcheck.py FILE|-     (exit 0 when valid, else 1 with the first problem)
As a module: problems(text) -> list of messages (empty when valid).
"""
import math
import re
import sys

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|NaN)")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def parse_labels(s, i, where):
    """Parse '{a="x",b="y"}' from s[i] == '{'; returns (dict, index after '}')."""
    labels = {}
    i += 1
    while True:
        if s.startswith("}", i):
            return labels, i + 1
        m = LABEL.match(s, i)
        if not m:
            raise ValueError("%s: bad label name at %r" % (where, s[i:i + 20]))
        name = m.group(0)
        if name.startswith("__"):
            raise ValueError("%s: reserved label name %s" % (where, name))
        if name in labels:
            raise ValueError("%s: label %s twice" % (where, name))
        i = m.end()
        if not s.startswith('="', i):
            raise ValueError("%s: label %s: expected =\"" % (where, name))
        i += 2
        val = []
        while True:
            if i >= len(s):
                raise ValueError("%s: label %s: unterminated value" % (where, name))
            c = s[i]
            if c == "\\":
                nxt = s[i + 1:i + 2]
                if nxt not in ("\\", '"', "n"):
                    raise ValueError("%s: label %s: bad escape \\%s" % (where, name, nxt))
                val.append({"n": "\n"}.get(nxt, nxt))
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                val.append(c)
                i += 1
        labels[name] = "".join(val)
        if s.startswith(",", i):
            i += 1
            if s.startswith("}", i):  # a trailing comma is accepted by Prometheus; not by us
                raise ValueError("%s: trailing comma in labels" % where)
        elif not s.startswith("}", i):
            raise ValueError("%s: expected , or } after label %s" % (where, name))


def parse_value(v, where):
    if not FLOAT.fullmatch(v):
        raise ValueError("%s: bad value %r" % (where, v))
    return float(v)


def problems(text):
    out = []
    try:
        check(text)
    except ValueError as e:
        out.append(str(e))
    return out


def check(text):
    if text and not text.endswith("\n"):
        raise ValueError("the exposition does not end with a newline")
    types, helps, done = {}, set(), set()
    current = None  # the family whose samples are being read
    series = set()
    hist = {}  # (family, labels without le) -> {"buckets": [(le, v)], "sum": x, "count": x}
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = "line %d" % n
        if line == "":
            raise ValueError("%s: blank line" % where)
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) < 3 or parts[0] != "#" or parts[1] not in ("HELP", "TYPE"):
                raise ValueError("%s: a comment other than HELP/TYPE: %r" % (where, line))
            kind, name = parts[1], parts[2]
            if not NAME.fullmatch(name):
                raise ValueError("%s: bad metric name %r" % (where, name))
            if kind == "HELP":
                if name in helps:
                    raise ValueError("%s: second HELP for %s" % (where, name))
                text_ = parts[3] if len(parts) > 3 else ""
                if re.search(r"\\[^\\n]|\\$", text_):
                    raise ValueError("%s: bad escape in HELP of %s" % (where, name))
                helps.add(name)
            else:
                if len(parts) != 4 or parts[3] not in TYPES:
                    raise ValueError("%s: bad TYPE line %r" % (where, line))
                if name in types:
                    raise ValueError("%s: second TYPE for %s" % (where, name))
                if name in done or name == current:
                    raise ValueError("%s: TYPE for %s after its samples" % (where, name))
                types[name] = parts[3]
            if current and name != current:
                done.add(current)
                current = None
            continue
        m = NAME.match(line)
        if not m:
            raise ValueError("%s: bad metric name in %r" % (where, line))
        name, i = m.group(0), m.end()
        labels = {}
        if line.startswith("{", i):
            labels, i = parse_labels(line, i, where)
        if not line.startswith(" ", i) or " " in line[i + 1:]:
            raise ValueError("%s: expected one space and a value (no timestamp): %r" %
                             (where, line))
        value = parse_value(line[i + 1:], where)
        fam, suffix = name, ""
        if name not in types:
            for suf in ("_bucket", "_sum", "_count"):
                if name.endswith(suf) and types.get(name[:-len(suf)]) == "histogram":
                    fam, suffix = name[:-len(suf)], suf
        if fam not in types:
            raise ValueError("%s: sample of %s with no TYPE" % (where, name))
        if fam in done:
            raise ValueError("%s: samples of %s are not contiguous" % (where, fam))
        if current and current != fam:
            done.add(current)
        current = fam
        key = (name, tuple(sorted(labels.items())))
        if key in series:
            raise ValueError("%s: series %s%s twice" % (where, name, labels))
        series.add(key)
        t = types[fam]
        if t == "counter" and not value >= 0:
            raise ValueError("%s: counter %s is %r" % (where, name, value))
        if t == "histogram":
            if not suffix:
                raise ValueError("%s: histogram %s sample without _bucket/_sum/_count" %
                                 (where, fam))
            rest = dict(labels)
            le = rest.pop("le", None)
            h = hist.setdefault((fam, tuple(sorted(rest.items()))),
                                {"buckets": [], "sum": None, "count": None})
            if suffix == "_bucket":
                if le is None:
                    raise ValueError("%s: %s without le" % (where, name))
                lev = parse_value(le, where + " le")
                if h["buckets"] and not lev > h["buckets"][-1][0]:
                    raise ValueError("%s: %s le=%s not increasing" % (where, name, le))
                if h["buckets"] and value < h["buckets"][-1][1]:
                    raise ValueError("%s: %s counts not cumulative" % (where, name))
                if h["count"] is not None or h["sum"] is not None:
                    raise ValueError("%s: %s bucket after _sum/_count" % (where, name))
                h["buckets"].append((lev, value))
            else:
                if le is not None:
                    raise ValueError("%s: %s with le" % (where, name))
                h[suffix[1:]] = value
    for (fam, labels), h in hist.items():
        where = "histogram %s%s" % (fam, dict(labels))
        if not h["buckets"] or h["buckets"][-1][0] != math.inf:
            raise ValueError("%s: no +Inf bucket" % where)
        if h["count"] is None or h["sum"] is None:
            raise ValueError("%s: missing _sum or _count" % where)
        if h["buckets"][-1][1] != h["count"]:
            raise ValueError("%s: +Inf bucket %r != _count %r" % (where, h["buckets"][-1][1],
                                                                  h["count"]))


def self_test():
    """The checker refuses what it should (run by `promcheck.py --self-test`)."""
    good = ('# HELP a_total A.\n# TYPE a_total counter\na_total{role="x"} 1.0\n'
            '# HELP h H.\n# TYPE h histogram\nh_bucket{le="0.1"} 1.0\nh_bucket{le="+Inf"} 2.0\n'
            'h_sum 0.5\nh_count 2.0\n')
    assert problems(good) == [], problems(good)
    bad = [
        good[:-1],                                                   # no final newline
        good.replace("a_total{", "a_total {"),                      # space before labels
        good.replace('role="x"', 'role="x",'),                      # trailing comma
        good.replace('role="x"', 'role="x",role="y"'),              # label twice
        good.replace('role="x"', '__r="x"'),                        # reserved name
        good.replace('role="x"', 'role="a\\tb"'),                   # bad escape
        good.replace("} 1.0", "} 1.0 123"),                         # timestamp
        good.replace("} 1.0", "} -1.0"),                            # negative counter
        good.replace("} 1.0", "} one"),                             # not a number
        good.replace('le="+Inf"} 2.0', 'le="+Inf"} 3.0'),           # +Inf != count
        good.replace('h_bucket{le="+Inf"} 2.0\n', ""),              # no +Inf
        good.replace('le="0.1"} 1.0', 'le="0.1"} 5.0'),             # not cumulative
        good + "a_total 2.0\n",                                     # not contiguous
        good + "# TYPE a_total counter\n",                          # second TYPE
        good.replace("# TYPE h histogram\n", ""),                   # no TYPE
        good + "\n",                                                # blank line
        good + "# just a comment\n",                                # other comment
        good.replace("a_total{role", "1a{role").replace("a_total counter", "1a counter"),
    ]
    for i, b in enumerate(bad):
        assert problems(b), "case %d accepted: %r" % (i, b)


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        print("promcheck self-test ok")
        sys.exit(0)
    data = sys.stdin.read() if sys.argv[1] == "-" else open(sys.argv[1]).read()
    p = problems(data)
    print(p[0] if p else "ok")
    sys.exit(1 if p else 0)
