// router_tools.js: tool calling through the official `openai` and `@anthropic-ai/sdk` clients,
// unmodified, against the real tandem-router whose decode worker is SCRIPTED
// (tests/integration/fake_worker.c) to write a well-formed DeepSeek-V3 tool call, the format the
// router picks for this model's vocabulary. Checks the parsed calls, the streamed deltas as the
// clients' stream helpers assemble them, a forced call (tool_choice named / required / Anthropic
// any) whose arguments the worker writes after the router's prefill, and malformed tools (400
// naming the field).
// Usage: node router_tools.js TANDEM_ROUTER FAKE_WORKER MODEL_DIR
'use strict';
const { spawn } = require('child_process');
const assert = require('assert/strict');
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');

const SECRET = 'router-tools-secret-0123456789';
const CB = '<\uff5ctool\u2581calls\u2581begin\uff5c>', CE = '<\uff5ctool\u2581calls\u2581end\uff5c>';
const B = '<\uff5ctool\u2581call\u2581begin\uff5c>', E = '<\uff5ctool\u2581call\u2581end\uff5c>';
const SEP = '<\uff5ctool\u2581sep\uff5c>';
const ARGS = '{"city": "Paris", "days": 2}';
const CALL = `Let me look.${CB}${B}function${SEP}get_weather\n\`\`\`json\n${ARGS}\n\`\`\`${E}${CE}`;
const FORCED_TAIL = `${ARGS}\n\`\`\`${E}${CE}`; // what the model writes after the prefill
const children = [];

const tools = [
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
  { type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
                  required: ['city'] } } },
];
const atools = tools.map((t) => ({ name: t.function.name, description: t.function.description,
                                   input_schema: t.function.parameters }));

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
  return { status: r.status, body: await r.json() };
}

async function main() {
  const [router, fake, model] = process.argv.slice(2);
  const m = await start([router, '--model', model, '--served_model_name', 'tiny',
                         '--http.listen', '127.0.0.1:0', '--rpc.listen', '127.0.0.1:0',
                         '--cluster.listen', '127.0.0.1:0', '--cluster.secret', SECRET,
                         '--log.level', 'warn'],
                        /http=\S+:(\d+) rpc=\S+ cluster=(\S+)\n/);
  const base = `http://127.0.0.1:${m[1]}`;
  const tok = async (t) => (await post(base, '/tokenize', { prompt: t, add_special_tokens: false })).body.tokens;
  let worker = null;
  const useWorker = async (text) => { // one scripted decode worker writing `text`
    if (worker) {
      worker.kill('SIGKILL');
      await new Promise((r) => worker.on('exit', r));
      for (let i = 0; i < 200 && (await fetch(base + '/health')).status === 200; i++)
        await new Promise((r) => setTimeout(r, 25));
    }
    const ids = await tok(text);
    const p = start([fake, '--role', 'decode', '--addr', m[2], '--secret', SECRET, '--id',
                     `d${children.length}`, '--tokens', ids.join(','), '--chunk', '3', '--hb-ms', '100'],
                    /ready/);
    worker = children[children.length - 1];
    await p;
    for (let i = 0; i < 200 && (await fetch(base + '/health')).status !== 200; i++)
      await new Promise((r) => setTimeout(r, 25));
  };
  let passed = 0;
  const check = async (name, fn) => {
    await fn();
    passed++;
    console.log(`ok ${passed} - ${name}`);
  };
  try {
    const openai = new OpenAI({ apiKey: 'unused', baseURL: `${base}/v1`, maxRetries: 0,
                                fetch: globalThis.fetch });
    const anthropic = new Anthropic({ apiKey: 'unused', baseURL: base, maxRetries: 0 });
    const messages = [{ role: 'user', content: 'Weather in Paris?' }];
    await useWorker(CALL);

    await check('chat: the model\'s tool call parsed into tool_calls', async () => {
      const r = await openai.chat.completions.create({ model: 'tiny', messages, tools });
      const msg = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'tool_calls');
      assert.equal(msg.content, 'Let me look.');
      assert.equal(msg.tool_calls.length, 1);
      assert.equal(msg.tool_calls[0].type, 'function');
      assert.match(msg.tool_calls[0].id, /^call_/);
      assert.equal(msg.tool_calls[0].function.name, 'get_weather');
      assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), { city: 'Paris', days: 2 });
      // tool_choice none: the same output is text
      const n = await openai.chat.completions.create({ model: 'tiny', messages, tools, tool_choice: 'none' });
      assert.equal(n.choices[0].message.tool_calls, undefined);
      assert.equal(n.choices[0].finish_reason, 'stop');
    });

    await check('chat stream: deltas assembled by the client\'s stream helper', async () => {
      const runner = openai.chat.completions.stream({ model: 'tiny', messages, tools });
      const final = await runner.finalChatCompletion();
      const msg = final.choices[0].message;
      assert.equal(final.choices[0].finish_reason, 'tool_calls');
      assert.equal(msg.content, 'Let me look.');
      assert.equal(msg.tool_calls.length, 1);
      assert.equal(msg.tool_calls[0].function.name, 'get_weather');
      assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), { city: 'Paris', days: 2 });
      // the raw chunks: content never carries the call's markers
      const s = await openai.chat.completions.create({ model: 'tiny', messages, tools, stream: true });
      let text = '';
      for await (const c of s) if (c.choices[0]?.delta?.content) text += c.choices[0].delta.content;
      assert.equal(text, 'Let me look.');
    });

    await check('chat: a tool result turn renders and answers', async () => {
      const r = await openai.chat.completions.create({ model: 'tiny', tools, messages: [
        ...messages,
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
          function: { name: 'get_weather', arguments: ARGS } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'sunny' }] });
      assert.equal(r.choices[0].message.tool_calls[0].function.name, 'get_weather');
    });

    await check('anthropic: tool_use blocks, whole and streamed', async () => {
      const msg = await anthropic.messages.create({ model: 'tiny', max_tokens: 64, messages, tools: atools });
      assert.equal(msg.stop_reason, 'tool_use');
      assert.equal(msg.content[0].type, 'text');
      assert.equal(msg.content[0].text, 'Let me look.');
      assert.equal(msg.content[1].type, 'tool_use');
      assert.match(msg.content[1].id, /^toolu_/);
      assert.equal(msg.content[1].name, 'get_weather');
      assert.deepEqual(msg.content[1].input, { city: 'Paris', days: 2 });
      const stream = anthropic.messages.stream({ model: 'tiny', max_tokens: 64, messages, tools: atools });
      let text = '';
      stream.on('text', (t) => { text += t; });
      const final = await stream.finalMessage();
      assert.equal(text, 'Let me look.');
      assert.equal(final.stop_reason, 'tool_use');
      assert.equal(final.content[1].type, 'tool_use');
      assert.deepEqual(final.content[1].input, { city: 'Paris', days: 2 });
      // a tool_result turn
      const r = await anthropic.messages.create({ model: 'tiny', max_tokens: 64, tools: atools, messages: [
        ...messages, { role: 'assistant', content: final.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: final.content[1].id, content: 'sunny' }] }] });
      assert.equal(r.content[1].name, 'get_weather');
    });

    await check('responses: plain, with instructions, a function tool and a function_call_output turn', async () => {
      const plain = await openai.responses.create({ model: 'tiny', input: 'hi', instructions: 'be brief' });
      assert.equal(plain.object, 'response');
      assert.match(plain.id, /^resp_/);
      assert.equal(plain.status, 'completed');
      assert.equal(plain.output.length, 1);
      assert.equal(plain.output[0].type, 'message');
      assert.match(plain.output[0].id, /^msg_/);
      assert.equal(plain.output[0].content[0].type, 'output_text');
      assert.equal(plain.output_text, CALL); // no tools: the call's text is text
      assert.ok(plain.usage.input_tokens > 0);
      assert.equal(plain.usage.total_tokens, plain.usage.input_tokens + plain.usage.output_tokens);
      assert.equal(plain.usage.input_tokens_details.cached_tokens, 0);
      const rtools = tools.map((x) => ({ type: 'function', ...x.function }));
      const r = await openai.responses.create({ model: 'tiny', input: 'Weather in Paris?', tools: rtools });
      assert.equal(r.output.length, 2);
      assert.equal(r.output[0].type, 'message');
      assert.equal(r.output_text, 'Let me look.');
      const fc = r.output[1];
      assert.equal(fc.type, 'function_call');
      assert.match(fc.id, /^fc_/);
      assert.match(fc.call_id, /^call_/);
      assert.equal(fc.name, 'get_weather');
      assert.deepEqual(JSON.parse(fc.arguments), { city: 'Paris', days: 2 });
      const turn = await openai.responses.create({ model: 'tiny', tools: rtools, input: [
        { role: 'user', content: 'Weather in Paris?' },
        { type: 'function_call', call_id: fc.call_id, name: fc.name, arguments: fc.arguments },
        { type: 'function_call_output', call_id: fc.call_id, output: 'sunny' }] });
      assert.equal(turn.status, 'completed');
      const cut = await openai.responses.create({ model: 'tiny', input: 'hi', max_output_tokens: 2 });
      assert.equal(cut.status, 'incomplete');
      assert.equal(cut.incomplete_details.reason, 'max_output_tokens');
      assert.equal(cut.usage.output_tokens, 2);
      await assert.rejects(openai.responses.create({ model: 'tiny', input: 'x', tools: [{ type: 'function', name: 'a b' }] }),
        (e) => e.status === 400 && e.param === 'tools[0].name');
      await assert.rejects(openai.responses.create({ model: 'tiny', input: [{ type: 'function_call_output', output: 'x' }] }),
        (e) => e.status === 400 && e.param === 'input[0].call_id');
    });

    await check('responses stream: the event types in order, assembled by the client', async () => {
      const rtools = tools.map((x) => ({ type: 'function', ...x.function }));
      const stream = await openai.responses.create({ model: 'tiny', input: 'hi', tools: rtools, stream: true });
      const types = [];
      let seq = 0, text = '', args = '';
      let done = null;
      for await (const e of stream) {
        assert.equal(e.sequence_number, seq++);
        types.push(e.type);
        if (e.type === 'response.output_text.delta') text += e.delta;
        if (e.type === 'response.function_call_arguments.delta') args += e.delta;
        if (e.type === 'response.completed') done = e.response;
      }
      assert.deepEqual(types, ['response.created', 'response.in_progress',
        'response.output_item.added', 'response.content_part.added', 'response.output_text.delta',
        ...types.slice(5, types.indexOf('response.output_text.done')).map(() => 'response.output_text.delta'),
        'response.output_text.done', 'response.content_part.done', 'response.output_item.done',
        'response.output_item.added', 'response.function_call_arguments.delta',
        'response.function_call_arguments.done', 'response.output_item.done', 'response.completed']);
      assert.equal(text, 'Let me look.');
      assert.deepEqual(JSON.parse(args), { city: 'Paris', days: 2 });
      assert.equal(done.output[1].name, 'get_weather');
      assert.ok(done.usage.output_tokens > 0);
      const helper = openai.responses.stream({ model: 'tiny', input: 'hi', instructions: 'be brief' });
      let htext = '';
      helper.on('response.output_text.delta', (e) => { htext += e.delta; });
      const final = await helper.finalResponse();
      assert.equal(htext, CALL);
      assert.equal(final.output_text, CALL);
      assert.equal(final.status, 'completed');
    });

    await check('malformed tools: 400 naming the field', async () => {
      await assert.rejects(openai.chat.completions.create({ model: 'tiny', messages, tools: [
        tools[0], { type: 'function', function: { name: 'bad name' } }] }),
      (e) => e.status === 400 && e.param === 'tools[1].function.name');
      await assert.rejects(openai.chat.completions.create({ model: 'tiny', messages, tools,
        tool_choice: { type: 'function', function: { name: 'nope' } } }),
      (e) => e.status === 400 && e.param === 'tool_choice');
      await assert.rejects(anthropic.messages.create({ model: 'tiny', max_tokens: 8, messages,
        tools: [{ name: 'x' }] }), (e) => e.status === 400 && /tools\.0\.input_schema/.test(e.message));
    });

    await useWorker(FORCED_TAIL);
    await check('forced call: the prefill names the tool, the model writes the arguments', async () => {
      const r = await openai.chat.completions.create({ model: 'tiny', messages, tools,
        tool_choice: { type: 'function', function: { name: 'get_weather' } } });
      const msg = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'tool_calls');
      assert.equal(msg.content, null);
      assert.equal(msg.tool_calls[0].function.name, 'get_weather');
      assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), { city: 'Paris', days: 2 });
      const req = await openai.chat.completions.create({ model: 'tiny', messages, tools, tool_choice: 'required' });
      assert.equal(req.choices[0].message.tool_calls[0].function.name, 'get_time'); // the first tool
      const runner = openai.chat.completions.stream({ model: 'tiny', messages, tools,
        tool_choice: { type: 'function', function: { name: 'get_weather' } } });
      const final = await runner.finalChatCompletion();
      assert.deepEqual(JSON.parse(final.choices[0].message.tool_calls[0].function.arguments),
                       { city: 'Paris', days: 2 });
      const a = anthropic.messages.stream({ model: 'tiny', max_tokens: 64, messages, tools: atools,
                                            tool_choice: { type: 'tool', name: 'get_weather' } });
      const am = await a.finalMessage();
      assert.equal(am.stop_reason, 'tool_use');
      assert.equal(am.content.find((b) => b.type === 'tool_use').name, 'get_weather');
      assert.deepEqual(am.content.find((b) => b.type === 'tool_use').input, { city: 'Paris', days: 2 });
      const rf = await openai.responses.create({ model: 'tiny', input: 'hi',
        tools: tools.map((x) => ({ type: 'function', ...x.function })),
        tool_choice: { type: 'function', name: 'get_weather' } });
      assert.equal(rf.output[0].type, 'function_call');
      assert.deepEqual(JSON.parse(rf.output[0].arguments), { city: 'Paris', days: 2 });
      const any = await anthropic.messages.create({ model: 'tiny', max_tokens: 64, messages, tools: atools,
                                                    tool_choice: { type: 'any' } });
      assert.equal(any.content.find((b) => b.type === 'tool_use').name, 'get_time');
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
