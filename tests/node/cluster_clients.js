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

  // Tools. A random-weight model never chooses a tool itself, so tool_choice forces the call:
  // the router prefills the call's opening (docs/api.md) and the model's continuation is the
  // arguments (not valid JSON here: nothing constrains them). Greedy: streamed equals whole.
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const forced = { type: 'function', function: { name: 'get_weather' } };
  await check('chat with a forced tool call, whole and streamed', async () => {
    const q = { model, messages, tools, tool_choice: forced, max_tokens: 8, temperature: 0 };
    const r = await openai.chat.completions.create(q);
    const calls = r.choices[0].message.tool_calls;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].type, 'function');
    assert.equal(calls[0].function.name, 'get_weather');
    assert.equal(typeof calls[0].function.arguments, 'string');
    const final = await openai.chat.completions.stream(q).finalChatCompletion();
    const sc = final.choices[0].message.tool_calls;
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.equal(sc[0].function.name, 'get_weather');
    assert.equal(sc[0].function.arguments, calls[0].function.arguments);
    const req = await openai.chat.completions.create({ ...q, tool_choice: 'required' });
    assert.equal(req.choices[0].message.tool_calls[0].function.name, 'get_weather');
    const none = await openai.chat.completions.create({ ...q, tool_choice: 'none' });
    assert.equal(none.choices[0].message.tool_calls, undefined);
    await assert.rejects(openai.chat.completions.create({ ...q, tools: [{ type: 'function',
      function: { name: 'ok' } }, { type: 'function', function: { name: 'x', parameters: 'no' } }] }),
    (e) => e.status === 400 && e.param === 'tools[1].function.parameters');
  });

  await check('anthropic with a forced tool_use, whole and streamed', async () => {
    const q = { model, max_tokens: 8, temperature: 0, messages: [{ role: 'user', content: 'Weather?' }],
      tools: [{ name: 'get_weather', input_schema: { type: 'object' } }],
      tool_choice: { type: 'tool', name: 'get_weather' } };
    const r = await anthropic.messages.create(q);
    const tu = r.content.find((b) => b.type === 'tool_use');
    assert.equal(r.stop_reason, 'tool_use');
    assert.equal(tu.name, 'get_weather');
    assert.match(tu.id, /^toolu_/);
    assert.equal(typeof tu.input, 'object');
    const final = await anthropic.messages.stream(q).finalMessage();
    const st = final.content.find((b) => b.type === 'tool_use');
    assert.equal(final.stop_reason, 'tool_use');
    assert.equal(st.name, 'get_weather');
    assert.deepEqual(st.input, tu.input);
    await assert.rejects(anthropic.messages.create({ ...q, tools: [{ name: 'get_weather' }] }),
      (e) => e.status === 400 && /tools\.0\.input_schema/.test(e.message));
  });

  await check('responses: plain and streamed equal, instructions, a function_call_output turn', async () => {
    const q = { model, input: 'What is disaggregated serving?', instructions: 'be brief',
                max_output_tokens: 8, temperature: 0 };
    const r = await openai.responses.create(q);
    assert.equal(r.object, 'response');
    assert.ok(['completed', 'incomplete'].includes(r.status));
    assert.equal(r.output[0].type, 'message');
    assert.ok(r.usage.input_tokens > 5 && r.usage.output_tokens >= 1);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    const s = await openai.responses.create({ ...q, stream: true });
    let text = '', last = null, seq = -1;
    for await (const e of s) {
      assert.equal(e.sequence_number, seq + 1);
      seq = e.sequence_number;
      if (e.type === 'response.output_text.delta') text += e.delta;
      last = e;
    }
    assert.equal(text, r.output_text);
    assert.ok(['response.completed', 'response.incomplete'].includes(last.type));
    const rtools = [{ type: 'function', name: 'get_weather', parameters: { type: 'object' } }];
    const fc = await openai.responses.create({ ...q, tools: rtools,
                                               tool_choice: { type: 'function', name: 'get_weather' } });
    const call = fc.output.find((o) => o.type === 'function_call');
    assert.equal(call.name, 'get_weather');
    assert.match(call.id, /^fc_/);
    const turn = await openai.responses.create({ ...q, tools: rtools, input: [
      { role: 'user', content: 'Weather?' },
      { type: 'function_call', call_id: call.call_id, name: call.name, arguments: '{"city":"Paris"}' },
      { type: 'function_call_output', call_id: call.call_id, output: 'sunny' }] });
    assert.ok(turn.usage.input_tokens > r.usage.input_tokens - 10);
    const helper = await openai.responses.stream(q).finalResponse();
    assert.equal(helper.output_text, r.output_text);
  });

  // structured outputs: bounded strings and an enum, so every greedy output ends on its own
  const person = { type: 'object', additionalProperties: false,
                   properties: { name: { type: 'string', maxLength: 8 },
                                 color: { enum: ['red', 'green', 'blue'] },
                                 age: { type: 'integer' }, ok: { type: 'boolean' } },
                   required: ['name', 'color', 'age', 'ok'] };
  const checkPerson = (v) => {
    assert.deepEqual(Object.keys(v).sort(), ['age', 'color', 'name', 'ok']);
    assert.ok(typeof v.name === 'string' && [...v.name].length <= 8, `name ${v.name}`);
    assert.ok(['red', 'green', 'blue'].includes(v.color));
    assert.ok(Number.isInteger(v.age) && typeof v.ok === 'boolean');
  };
  await check('chat.completions.parse with a strict JSON schema', async () => {
    const r = await openai.chat.completions.parse({
      model, messages, max_tokens: 200, temperature: 0,
      response_format: { type: 'json_schema',
                         json_schema: { name: 'person', strict: true, schema: person } } });
    assert.equal(r.choices[0].finish_reason, 'stop');
    checkPerson(r.choices[0].message.parsed);
  });
  await check('responses.create with text.format json_schema', async () => {
    const r = await openai.responses.create({
      model, input: 'Describe a person', max_output_tokens: 200, temperature: 0,
      text: { format: { type: 'json_schema', name: 'person', strict: true, schema: person } } });
    checkPerson(JSON.parse(r.output_text));
  });

  console.log(`${passed} checks passed`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
