// access_clients.js: the official `openai` and `@anthropic-ai/sdk` npm clients, unmodified,
// against a real tandem cluster whose router requires API keys (http.api_keys_file, started by
// tests/integration/cluster_access.py): a valid key works through `Authorization: Bearer`
// (openai) and `x-api-key` (anthropic), a wrong key is an AuthenticationError (401), and a key
// over its requests-per-window limit gets a RateLimitError (429) with the x-ratelimit-* headers,
// which the client's own retry (Retry-After) then gets through once the window allows.
// Usage: node access_clients.js BASE_URL MODEL_NAME GOOD_KEY LIMITED_KEY LIMITED_RPM WINDOW_S
'use strict';
const assert = require('assert/strict');
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');

async function main() {
  const [base, model, good, limited, rpmText, windowText] = process.argv.slice(2);
  const rpm = Number(rpmText), windowS = Number(windowText);
  let passed = 0;
  const check = async (name, fn) => {
    await fn();
    passed++;
    console.log(`ok ${passed} - ${name}`);
  };
  const client = (apiKey, maxRetries = 0) =>
    new OpenAI({ apiKey, baseURL: `${base}/v1`, maxRetries, fetch: globalThis.fetch });
  const messages = [{ role: 'user', content: 'Say hi' }];

  await check('a valid key works (Authorization: Bearer)', async () => {
    const r = await client(good).chat.completions.create({ model, messages, max_tokens: 4,
                                                           temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.ok(r.usage.completion_tokens >= 1);
  });

  await check('a valid key works (x-api-key, anthropic client)', async () => {
    const a = new Anthropic({ apiKey: good, baseURL: base, maxRetries: 0,
                              fetch: globalThis.fetch });
    const r = await a.messages.create({ model, max_tokens: 4, messages });
    assert.equal(r.type, 'message');
  });

  await check('a wrong key is refused with 401', async () => {
    await assert.rejects(
      client('tdk-not-a-key').chat.completions.create({ model, messages, max_tokens: 4 }),
      (e) => e instanceof OpenAI.AuthenticationError && e.status === 401 &&
             e.code === 'invalid_api_key');
    const a = new Anthropic({ apiKey: 'tdk-not-a-key', baseURL: base, maxRetries: 0,
                              fetch: globalThis.fetch });
    await assert.rejects(a.messages.create({ model, max_tokens: 4, messages }),
                         (e) => e instanceof Anthropic.AuthenticationError && e.status === 401);
  });

  await check(`a key over its ${rpm} requests per ${windowS} s gets 429 with the headers`,
              async () => {
    const c = client(limited);
    let last = null;
    for (let i = 0; i < rpm; i++) {
      const { data, response } = await c.completions
        .create({ model, prompt: 'hi', max_tokens: 2 }).withResponse();
      assert.ok(data.choices[0].text !== undefined);
      last = response.headers;
    }
    assert.equal(last.get('x-ratelimit-limit-requests'), String(rpm));
    assert.equal(last.get('x-ratelimit-remaining-requests'), '0');
    let err = null;
    try {
      await c.completions.create({ model, prompt: 'hi', max_tokens: 2 });
    } catch (e) {
      err = e;
    }
    assert.ok(err instanceof OpenAI.RateLimitError, `expected a RateLimitError, got ${err}`);
    assert.equal(err.status, 429);
    assert.equal(err.code, 'rate_limit_exceeded');
    // openai >= 5: the error carries a Headers object
    assert.equal(err.headers.get('x-ratelimit-limit-requests'), String(rpm));
    assert.equal(err.headers.get('x-ratelimit-remaining-requests'), '0');
    assert.match(err.headers.get('x-ratelimit-reset-requests'), /^[0-9.]+m?s$/);
    const ra = Number(err.headers.get('retry-after'));
    assert.ok(ra >= 1 && ra <= Math.ceil(windowS), `retry-after ${ra}`);
  });

  await check('the client\'s own retry gets through after the reset', async () => {
    const t0 = Date.now();
    const r = await client(limited, 2).completions.create({ model, prompt: 'hi',
                                                             max_tokens: 2 });
    const waited = (Date.now() - t0) / 1000;
    assert.ok(r.choices.length === 1);
    assert.ok(waited > 0.05 && waited < windowS + 2, `retried after ${waited} s`);
    console.log(`# served after the client waited ${waited.toFixed(2)} s`);
  });
  console.log(`1..${passed}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
