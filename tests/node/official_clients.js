// official_clients.js: the official `openai` and `@anthropic-ai/sdk` npm clients, unmodified,
// against tandem's HTTP API framing (tests/integration/api_server.c, a scripted model that always
// answers "Hello, wörld!" in 4 tokens). Usage: node official_clients.js PATH_TO_api_server
'use strict';
const { spawn } = require('child_process');
const assert = require('assert/strict');
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');

const TEXT = 'Hello, w\u00f6rld!';

async function main() {
  const server = spawn(process.argv[2], [], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    server.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/port (\d+)/);
      if (m) resolve(Number(m[1]));
    });
    server.on('exit', (code) => reject(new Error(`api_server exited with ${code}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  let passed = 0;
  const check = async (name, fn) => {
    await fn();
    passed++;
    console.log(`ok ${passed} - ${name}`);
  };
  try {
    // The platform's fetch (undici): openai 4's bundled node-fetch misreports some chunked
    // responses as "Premature close" under Debian's node 18 (seen once in a fresh Debian root).
    const openai = new OpenAI({ apiKey: 'unused', baseURL: `${base}/v1`, maxRetries: 0,
                                fetch: globalThis.fetch });
    const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }];

    await check('chat completion', async () => {
      const r = await openai.chat.completions.create({ model: 'tiny', messages });
      assert.equal(r.object, 'chat.completion');
      assert.equal(r.choices[0].message.role, 'assistant');
      assert.equal(r.choices[0].message.content, TEXT);
      assert.equal(r.choices[0].finish_reason, 'stop');
      assert.equal(r.usage.prompt_tokens, 7);
      assert.equal(r.usage.completion_tokens, 4);
      assert.equal(r.usage.total_tokens, 11);
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
    });

    await check('chat completion stream with usage', async () => {
      const stream = await openai.chat.completions.create({
        model: 'tiny', messages, stream: true, stream_options: { include_usage: true },
      });
      let text = '', roles = 0, finish = null, usage = null, chunks = 0;
      for await (const c of stream) {
        chunks++;
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
      assert.equal(usage.total_tokens, 11);
      assert.equal(chunks, 1 + 4 + 1 + 1); // role, one per token, finish, usage
    });

    await check('chat stream helper and logprobs', async () => {
      const runner = openai.chat.completions.stream({
        model: 'tiny', messages, max_tokens: 2, logprobs: true, top_logprobs: 2,
      });
      const final = await runner.finalChatCompletion();
      assert.equal(final.choices[0].message.content, 'Hello,');
      assert.equal(final.choices[0].finish_reason, 'length');
      const lp = final.choices[0].logprobs.content;
      assert.equal(lp.length, 2);
      assert.equal(lp[0].token, 'Hello');
      assert.equal(lp[0].top_logprobs.length, 2);
      assert.deepEqual(lp[0].bytes, [...Buffer.from('Hello')]);
    });

    await check('completions with n=2, and streamed', async () => {
      const r = await openai.completions.create({ model: 'tiny', prompt: 'Say hi', n: 2, logprobs: 1 });
      assert.equal(r.object, 'text_completion');
      assert.equal(r.choices.length, 2);
      assert.equal(r.choices[1].text, TEXT);
      assert.deepEqual(r.choices[0].logprobs.text_offset, [0, 5, 6, 13]);
      const stream = await openai.completions.create({ model: 'tiny', prompt: [1, 2, 3], n: 2, stream: true });
      const texts = ['', ''];
      for await (const c of stream) for (const ch of c.choices) texts[ch.index] += ch.text;
      assert.deepEqual(texts, [TEXT, TEXT]);
    });

    await check('bad request is a 400 naming the parameter', async () => {
      await assert.rejects(
        openai.chat.completions.create({ model: 'tiny', messages, temperature: 5 }),
        (e) => e.status === 400 && e.param === 'temperature' && /\[0, 2\]/.test(e.message));
    });

    const anthropic = new Anthropic({ apiKey: 'unused', baseURL: base, maxRetries: 0 });
    await check('anthropic message', async () => {
      const m = await anthropic.messages.create({
        model: 'tiny', max_tokens: 16, system: 'be brief', messages: [{ role: 'user', content: 'hi' }],
      });
      assert.equal(m.type, 'message');
      assert.equal(m.content[0].text, TEXT);
      assert.equal(m.stop_reason, 'end_turn');
      assert.equal(m.usage.input_tokens, 7);
      assert.equal(m.usage.output_tokens, 4);
    });

    await check('anthropic message stream', async () => {
      const stream = anthropic.messages.stream({
        model: 'tiny', max_tokens: 3, messages: [{ role: 'user', content: 'hi' }],
      });
      let text = '';
      stream.on('text', (t) => { text += t; });
      const final = await stream.finalMessage();
      assert.equal(text, 'Hello, w\u00f6rld');
      assert.equal(final.content[0].text, 'Hello, w\u00f6rld');
      assert.equal(final.stop_reason, 'max_tokens');
      assert.equal(final.usage.output_tokens, 3);
    });

    await check('anthropic bad request', async () => {
      await assert.rejects(
        anthropic.messages.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] }),
        (e) => e.status === 400);
    });
    console.log(`${passed} passed, 0 failed`);
  } finally {
    server.kill('SIGTERM');
  }
}

main().catch((e) => {
  console.error(e);
  console.log('0 passed, 1 failed');
  process.exit(1);
});
