// cluster_clients.js: the official `openai` and `@anthropic-ai/sdk` npm clients, unmodified,
// against a real tandem cluster (router + prefill + decode on loopback, started by
// tests/integration/cluster_test.py). Greedy requests must give the same text streamed and not,
// and usage must count what was generated.
// Usage: node cluster_clients.js BASE_URL MODEL_NAME
'use strict';
const assert = require('assert/strict');
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');

async function main() {
  const base = process.argv[2];
  const model = process.argv[3];
  let passed = 0;
  const check = async (name, fn) => {
    await fn();
    passed++;
    console.log(`ok ${passed} - ${name}`);
  };
  const openai = new OpenAI({ apiKey: 'unused', baseURL: `${base}/v1`, maxRetries: 0,
                              fetch: globalThis.fetch });
  const messages = [{ role: 'system', content: 'be brief' },
                    { role: 'user', content: 'What is disaggregated serving?' }];

  let chatText = null;
  await check('models lists the served model', async () => {
    const list = await openai.models.list();
    const ids = list.data.map((m) => m.id);
    assert.ok(ids.includes(model), `models: ${ids}`);
  });

  await check('chat completion (greedy)', async () => {
    const r = await openai.chat.completions.create({ model, messages, max_tokens: 12,
                                                     temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > 5);
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
    chatText = r.choices[0].message.content;
  });

  await check('chat completion stream equals the whole response', async () => {
    const stream = await openai.chat.completions.create({
      model, messages, max_tokens: 12, temperature: 0, stream: true,
      stream_options: { include_usage: true },
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
    assert.equal(roles, 1);
    assert.equal(text, chatText);
    assert.ok(['stop', 'length'].includes(finish));
    assert.ok(usage && usage.completion_tokens >= 1);
  });

  let complText = null;
  await check('completion (greedy, logprobs)', async () => {
    const r = await openai.completions.create({ model, prompt: 'The cluster', max_tokens: 8,
                                                temperature: 0, logprobs: 2 });
    assert.equal(r.object, 'text_completion');
    complText = r.choices[0].text;
    assert.equal(r.choices[0].logprobs.tokens.length, r.usage.completion_tokens);
    assert.ok(r.choices[0].logprobs.token_logprobs.every((x) => x <= 0));
  });

  await check('completion stream equals the whole response', async () => {
    const stream = await openai.completions.create({ model, prompt: 'The cluster', max_tokens: 8,
                                                     temperature: 0, stream: true });
    let text = '';
    for await (const c of stream) if (c.choices.length) text += c.choices[0].text;
    assert.equal(text, complText);
  });

  await check('seeded sampling is reproducible, n=2', async () => {
    const a = await openai.completions.create({ model, prompt: 'x', max_tokens: 10,
                                                temperature: 1, seed: 42, n: 2 });
    const b = await openai.completions.create({ model, prompt: 'x', max_tokens: 10,
                                                temperature: 1, seed: 42, n: 2 });
    assert.equal(a.choices.length, 2);
    assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text));
  });

  await check('API errors surface as the client\'s error type', async () => {
    await assert.rejects(
      openai.chat.completions.create({ model, messages: [], max_tokens: 4 }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
  });

  const anthropic = new Anthropic({ apiKey: 'unused', baseURL: base, maxRetries: 0,
                                    fetch: globalThis.fetch });
  let msgText = null;
  await check('anthropic messages', async () => {
    const r = await anthropic.messages.create({
      model, max_tokens: 10, temperature: 0, system: 'be brief',
      messages: [{ role: 'user', content: 'Hello' }],
    });
    assert.equal(r.type, 'message');
    assert.equal(r.role, 'assistant');
    assert.ok(['end_turn', 'max_tokens', 'stop_sequence'].includes(r.stop_reason));
    assert.ok(r.usage.input_tokens > 1 && r.usage.output_tokens >= 1);
    msgText = r.content.length ? r.content[0].text : '';
  });

  await check('anthropic messages stream equals the whole message', async () => {
    const stream = anthropic.messages.stream({
      model, max_tokens: 10, temperature: 0, system: 'be brief',
      messages: [{ role: 'user', content: 'Hello' }],
    });
    let text = '';
    stream.on('text', (t) => { text += t; });
    const final = await stream.finalMessage();
    assert.equal(text, msgText);
    assert.ok(final.usage.output_tokens >= 1);
  });

  console.log(`${passed} checks passed`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
