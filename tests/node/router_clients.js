// router_clients.js: the official `openai` and `@anthropic-ai/sdk` npm clients, unmodified,
// against the real tandem-router binary whose only decode worker is SCRIPTED
// (tests/integration/fake_worker.c: the real control protocol, canned tokens, no engine).
// Usage: node router_clients.js TANDEM_ROUTER FAKE_WORKER MODEL_DIR
'use strict';
const { spawn } = require('child_process');
const assert = require('assert/strict');
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');

const TEXT = 'Hello, w\u00f6rld!';
const SECRET = 'router-clients-secret-0123456789';
const children = [];

function start(argv, pattern) {
  const p = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(p);
  return new Promise((resolve, reject) => {
    let out = '';
    p.stdout.on('data', (d) => {
      out += d;
      const m = out.match(pattern);
      if (m) resolve(m);
    });
    p.on('exit', (code) => reject(new Error(`${argv[0]} exited with ${code}`)));
  });
}

async function post(base, path, body) {
  const r = await fetch(base + path, { method: 'POST', body: JSON.stringify(body),
                                       headers: { 'content-type': 'application/json' } });
  return r.json();
}

async function main() {
  const [router, fake, model] = process.argv.slice(2);
  const m = await start([router, '--model', model, '--served_model_name', 'tiny',
                         '--http.listen', '127.0.0.1:0', '--rpc.listen', '127.0.0.1:0',
                         '--cluster.listen', '127.0.0.1:0', '--cluster.secret', SECRET,
                         '--log.level', 'warn'],
                        /http=\S+:(\d+) rpc=\S+ cluster=(\S+)\n/);
  const base = `http://127.0.0.1:${m[1]}`;
  const ids = (await post(base, '/tokenize', { prompt: TEXT, add_special_tokens: false })).tokens;
  const first3 = (await post(base, '/detokenize', { tokens: ids.slice(0, 3) })).prompt;
  const first2 = (await post(base, '/detokenize', { tokens: ids.slice(0, 2) })).prompt;
  await start([fake, '--role', 'decode', '--addr', m[2], '--secret', SECRET, '--id', 'd0',
               '--tokens', ids.join(','), '--chunk', '2'], /ready/);
  for (let i = 0; i < 100; i++) { // registered once /health says so
    if ((await fetch(base + '/health')).status === 200) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  let passed = 0;
  const check = async (name, fn) => {
    await fn();
    passed++;
    console.log(`ok ${passed} - ${name}`);
  };
  try {
    const openai = new OpenAI({ apiKey: 'unused', baseURL: `${base}/v1`, maxRetries: 0,
                                fetch: globalThis.fetch });
    const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }];

    await check('models', async () => {
      const list = await openai.models.list();
      assert.equal(list.data[0].id, 'tiny');
    });

    await check('chat completion', async () => {
      const r = await openai.chat.completions.create({ model: 'tiny', messages });
      assert.equal(r.object, 'chat.completion');
      assert.equal(r.choices[0].message.content, TEXT);
      assert.equal(r.choices[0].finish_reason, 'stop');
      assert.equal(r.usage.completion_tokens, ids.length);
      assert.ok(r.usage.prompt_tokens > 0);
      assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + ids.length);
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
    });

    await check('chat completion stream with usage', async () => {
      const stream = await openai.chat.completions.create({
        model: 'tiny', messages, stream: true, stream_options: { include_usage: true },
      });
      let text = '', roles = 0, finish = null, usage = null;
      for await (const c of stream) {
        if (c.usage) usage = c.usage;
        if (!c.choices.length) continue;
        const d = c.choices[0].delta;
        if (d.role) roles++;
        if (d.content) text += d.content;
        if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
      }
      assert.equal(text, TEXT);
      assert.equal(roles, 1);
      assert.equal(finish, 'stop');
      assert.equal(usage.completion_tokens, ids.length);
    });

    await check('chat stream helper, logprobs and a stop string', async () => {
      const runner = openai.chat.completions.stream({
        model: 'tiny', messages, max_tokens: 2, logprobs: true, top_logprobs: 2,
      });
      const final = await runner.finalChatCompletion();
      assert.equal(final.choices[0].message.content, first2);
      assert.equal(final.choices[0].finish_reason, 'length');
      assert.equal(final.choices[0].logprobs.content.length, 2);
      assert.equal(final.choices[0].logprobs.content[0].top_logprobs.length, 2);
      const r = await openai.chat.completions.create({ model: 'tiny', messages, stop: ['w\u00f6'] });
      assert.equal(r.choices[0].message.content, 'Hello, ');
      assert.equal(r.choices[0].finish_reason, 'stop');
    });

    await check('completions with n=2, and streamed', async () => {
      const r = await openai.completions.create({ model: 'tiny', prompt: 'Say hi', n: 2, logprobs: 1 });
      assert.equal(r.choices.length, 2);
      assert.equal(r.choices[1].text, TEXT);
      assert.equal(r.choices[0].logprobs.tokens.length, ids.length);
      const stream = await openai.completions.create({ model: 'tiny', prompt: [1, 2, 3], n: 2, stream: true });
      const texts = ['', ''];
      for await (const c of stream) for (const ch of c.choices) texts[ch.index] += ch.text;
      assert.deepEqual(texts, [TEXT, TEXT]);
    });

    await check('bad request is a 400 naming the parameter', async () => {
      await assert.rejects(
        openai.chat.completions.create({ model: 'tiny', messages, temperature: 5 }),
        (e) => e.status === 400 && e.param === 'temperature');
      await assert.rejects(
        openai.chat.completions.create({ model: 'nope', messages }), (e) => e.status === 404);
    });

    const anthropic = new Anthropic({ apiKey: 'unused', baseURL: base, maxRetries: 0 });
    await check('anthropic message', async () => {
      const msg = await anthropic.messages.create({
        model: 'tiny', max_tokens: 16, system: 'be brief', messages: [{ role: 'user', content: 'hi' }],
      });
      assert.equal(msg.content[0].text, TEXT);
      assert.equal(msg.stop_reason, 'end_turn');
      assert.equal(msg.usage.output_tokens, ids.length);
    });

    await check('anthropic message stream', async () => {
      const stream = anthropic.messages.stream({
        model: 'tiny', max_tokens: 3, messages: [{ role: 'user', content: 'hi' }],
      });
      let text = '';
      stream.on('text', (t) => { text += t; });
      const final = await stream.finalMessage();
      assert.equal(text, first3);
      assert.equal(final.stop_reason, 'max_tokens');
      assert.equal(final.usage.output_tokens, 3);
    });
    console.log(`${passed} passed, 0 failed`);
  } finally {
    for (const c of children.reverse()) c.kill('SIGTERM');
  }
}

main().catch((e) => {
  console.error(e);
  console.log('0 passed, 1 failed');
  for (const c of children) c.kill('SIGKILL');
  process.exit(1);
});
