#!/usr/bin/python3
"""chat_template_test.py: the real tandem-router renders chat with the model's own Jinja template.

usage: chat_template_test.py TANDEM_ROUTER MODEL_DIR

- /tokenize then /detokenize of a conversation with a system prompt, tool calls and tool
  results gives back exactly what Python Jinja2 renders from the model's tokenizer_config.json as
  transformers does (tests/chat/hf_jinja.py);
- a --chat_template file whose template calls raise_exception answers 400 with its message on
  /v1/chat/completions and /tokenize;
- a --chat_template file that does not parse stops the router at load, naming the file, line and
  column.
"""
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "chat"))
import hf_jinja  # noqa: E402
import render_chat  # noqa: E402

ROUTER, MODEL = sys.argv[1:3]
TMP = tempfile.mkdtemp(prefix="chat_template_test.")
SECRET = "chat-template-test-secret-0123456789"


def start(*opts):
    args = [ROUTER, "--model", MODEL, "--http.listen", "127.0.0.1:0", "--rpc.listen",
            "127.0.0.1:0", "--cluster.listen", "127.0.0.1:0", "--cluster.secret", SECRET] + \
        list(opts)
    err = open(os.path.join(TMP, "router.err"), "w+")
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True)
    line = p.stdout.readline()
    return p, line, err


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)


def port_of(line):
    m = re.match(r"tandem-router: http=\S+:(\d+) ", line)
    if not m:
        raise SystemExit("FAIL: no start line: %r" % line)
    return int(m.group(1))


def stop(p):
    p.terminate()
    p.wait(10)


def main():
    fails = []
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "{\"t\": 12}"},
                {"role": "assistant", "content": "12 °C."},
                {"role": "user", "content": "Thanks"}]

    # 1. the model's own template, equal to Python's render
    p, line, err = start()
    port = port_of(line)
    with open(os.path.join(MODEL, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    want = hf_jinja.render(hf_jinja.compile_template(cfg["chat_template"]),
                           render_chat.normalize(messages), add_generation_prompt=True,
                           special=hf_jinja.special_tokens_map(cfg))
    st, js = post(port, "/tokenize", {"messages": messages})
    if st != 200:
        fails.append("tokenize: %d %r" % (st, js))
    else:
        st, back = post(port, "/detokenize", {"tokens": js["tokens"]})
        if st != 200 or back["prompt"] != want:
            fails.append("rendered prompt differs from Python Jinja2:\n  want %r\n  got  %r" %
                         (want, back.get("prompt")))
    st, js = post(port, "/tokenize", {"messages": [{"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "{bad"}}]}]})
    if st != 400 or "tool_calls[0].function.arguments: not valid JSON" not in \
            js["error"]["message"]:
        fails.append("malformed tool call arguments: %d %r" % (st, js))
    stop(p)

    # 2. a template that raises: 400 with its message
    raising = os.path.join(TMP, "raising.jinja")
    with open(raising, "w") as f:
        f.write("{% if 'forbidden' in messages[-1].content %}"
                "{{ raise_exception('no forbidden words, please') }}{% endif %}"
                "{{ bos_token }}{{ messages[-1].content }}\n")
    p, line, err = start("--chat_template", raising)
    port = port_of(line)
    for path in ("/v1/chat/completions", "/tokenize"):
        st, js = post(port, path, {"messages": [{"role": "user", "content": "a forbidden word"}],
                                   "max_tokens": 2})
        msg = js.get("error", {}).get("message", "")
        if st != 400 or "no forbidden words, please" not in msg:
            fails.append("%s with a raising template: %d %r" % (path, st, js))
    st, js = post(port, "/tokenize", {"messages": [{"role": "user", "content": "fine"}]})
    if st != 200 or js["count"] < 1:
        fails.append("raising template, allowed content: %d %r" % (st, js))
    stop(p)

    # 3. a template that does not parse: the router stops at load, naming file and position
    broken = os.path.join(TMP, "broken.jinja")
    with open(broken, "w") as f:
        f.write("{% for m in messages %}\n  {{ m.content + }}\n{% endfor %}\n")
    p, line, err = start("--chat_template", broken)
    try:
        rc = p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = None
    err.seek(0)
    text = err.read()
    if rc in (None, 0) or (broken + ": template:2:") not in text:
        fails.append("broken template: rc=%r stderr=%r" % (rc, text[-400:]))

    for f in fails:
        print("FAIL:", f)
    if not fails:
        print("chat template through the router: model template equal to Python, raise -> 400, "
              "parse error at load: ok")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
