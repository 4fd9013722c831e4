// Drives a real `lamina serve` (the shipped model, a free loopback port) with the real `openai`
// npm package: models, chat completions with and without streaming, n: 2 choices, text
// completions, prefix reuse in usage, a wrong API key, malformed requests, a prompt over the
// slot's context, and tool calls (forced by tool_choice, plain and streamed).
// Exit 0: pass; 77: skipped (the openai package is not installed); anything else: failure.
import assert from 'node:assert/strict';

import { startServer as startLamina, stopServer as stopLamina, binary, model, requireClient, checkRunner } from './node_server.mjs';

const openai = requireClient('openai');
const OpenAI = openai.default ?? openai;

const startServer = (extra) =>
  startLamina(binary, ['-m', model, '-np', '2', '-c', '1024', '--alias', 'tiny-counter,lamina-counter',
                       '--tags', 'test,tiny', ...extra]);

async function stopServer(s) {
  const ms = await stopLamina(s);
  assert.ok(ms < 5000, 'SIGTERM ends the server within a few seconds');
}

const count = (n) => Array.from({ length: n }, (_, i) => String(i + 1)).join('\n');
const countPrompt = (n) => `Count from 1 to ${n}, one number per line.`;
const { check, finish } = checkRunner();

const key = 'sk-lamina-test';
const server = await startServer(['--api-key', key]);
const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: key, maxRetries: 0 });

// Aliases are a sorted set, as llama-server's: the id is the first in that order.
await check('models.list gives the first alias as id, with aliases and tags', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, 'lamina-counter');
  assert.deepEqual(list.data[0].aliases, ['lamina-counter', 'tiny-counter']);
  assert.deepEqual(list.data[0].tags, ['test', 'tiny']);
});

let plain;
await check('chat.completions.create counts at temperature 0', async () => {
  plain = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 100,
    messages: [{ role: 'user', content: countPrompt(12) }],
  });
  assert.equal(plain.object, 'chat.completion');
  assert.match(plain.id, /^chatcmpl-/);
  assert.equal(plain.model, 'lamina-counter');
  assert.ok(plain.system_fingerprint);
  assert.equal(plain.choices[0].message.role, 'assistant');
  assert.equal(plain.choices[0].message.content, count(12));
  assert.equal(plain.choices[0].finish_reason, 'stop');
  assert.ok(plain.usage.prompt_tokens > 0);
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);
});

await check('the same request again reuses the cached prompt', async () => {
  const again = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 100,
    messages: [{ role: 'user', content: countPrompt(12) }],
  });
  assert.equal(again.choices[0].message.content, count(12));
  assert.equal(again.usage.prompt_tokens_details.cached_tokens, again.usage.prompt_tokens - 1);
});

await check('streamed chat equals the plain answer; role-only first delta, usage chunk', async () => {
  const stream = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 100, stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: 'user', content: countPrompt(12) }],
  });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.ok(!chunks[0].choices[0].delta.content);
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
  assert.equal(text, count(12));
  const last = chunks.filter((c) => c.choices.length > 0).at(-1);
  assert.deepEqual(last.choices[0].delta, {});
  assert.equal(last.choices[0].finish_reason, 'stop');
  const usage = chunks.at(-1);
  assert.equal(usage.choices.length, 0);
  assert.equal(usage.usage.completion_tokens, plain.usage.completion_tokens);
  for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');
});

await check('logprobs: one entry per token, greedy picks the top one', async () => {
  const r = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 100, logprobs: true, top_logprobs: 3,
    messages: [{ role: 'user', content: countPrompt(5) }],
  });
  const entries = r.choices[0].logprobs.content;
  assert.equal(entries.length, r.usage.completion_tokens);
  assert.equal(entries.map((e) => e.token).join(''), count(5));
  for (const e of entries) {
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.ok(e.logprob <= 0 && e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob);
  }
});

await check('n: 2 gives two choices; usage counts the prompt once and both answers', async () => {
  const r = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 100, n: 2,
    messages: [{ role: 'user', content: countPrompt(12) }],
  });
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  for (const c of r.choices) {
    assert.equal(c.message.content, count(12));  // greedy: equal answers
    assert.equal(c.finish_reason, 'stop');
  }
  assert.equal(r.usage.prompt_tokens, plain.usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 2 * plain.usage.completion_tokens);
  // Streamed and sampled: each chunk names its choice; the choices add up separately.
  const stream = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 1, seed: 5, max_tokens: 30, n: 2, stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: 'user', content: countPrompt(12) }],
  });
  const texts = ['', ''];
  const finished = [null, null];
  let usage;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      texts[ch.index] += ch.delta?.content ?? '';
      finished[ch.index] = ch.finish_reason ?? finished[ch.index];
    }
  }
  assert.ok(finished.every((f) => f === 'stop' || f === 'length'));
  assert.ok(texts[0].length > 0 && texts[1].length > 0);
  assert.equal(usage.prompt_tokens, plain.usage.prompt_tokens);
  await assert.rejects(client.chat.completions.create({ model: 'x', n: 17,
                                                        messages: [{ role: 'user', content: 'hi' }] }),
                       (e) => e.status === 400 && /"n" must be an integer in \[1, 16\], got 17/.test(e.message));
});

await check('max_tokens ends with finish_reason length', async () => {
  const r = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 5,
    messages: [{ role: 'user', content: countPrompt(50) }],
  });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 5);
});

await check('stop strings end the answer before them', async () => {
  const r = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 100, stop: ['\n5\n'],
    messages: [{ role: 'user', content: countPrompt(12) }],
  });
  assert.equal(r.choices[0].message.content, count(4));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

await check('response_format json_schema gives JSON of the schema; json_object a JSON object', async () => {
  const schema = {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer' } },
    required: ['name', 'age'],
    additionalProperties: false,
  };
  const r = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 80,
    messages: [{ role: 'user', content: 'Write a JSON object with the fields "name" = "Alice", "age" = 34.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } },
  });
  const doc = JSON.parse(r.choices[0].message.content);
  assert.deepEqual(Object.keys(doc), ['name', 'age']);
  assert.equal(typeof doc.name, 'string');
  assert.ok(Number.isInteger(doc.age));
  assert.equal(r.choices[0].finish_reason, 'stop');
  const any = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 80,
    messages: [{ role: 'user', content: 'Write a JSON object with the fields "name" = "Bob", "age" = 7.' }],
    response_format: { type: 'json_object' },
  });
  const obj = JSON.parse(any.choices[0].message.content);
  assert.equal(typeof obj, 'object');
  assert.ok(!Array.isArray(obj) && obj !== null);
});

await check('completions.create, plain and streamed', async () => {
  const prompt = '<|im_start|>user\n' + countPrompt(7) + '<|im_end|>\n<|im_start|>assistant\n';
  const r = await client.completions.create({ model: 'lamina-counter', prompt, temperature: 0, max_tokens: 60 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].text, count(7));
  const stream = await client.completions.create({ model: 'lamina-counter', prompt, temperature: 0,
                                                    max_tokens: 60, stream: true });
  let text = '';
  let finish = null;
  for await (const c of stream) {
    text += c.choices[0].text;
    finish = c.choices[0].finish_reason ?? finish;
  }
  assert.equal(text, count(7));
  assert.equal(finish, 'stop');
});

await check('a wrong API key is a 401 authentication_error', async () => {
  const bad = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }] }),
                       (e) => e.status === 401 && e.error?.type === 'authentication_error' &&
                              /Invalid API Key/.test(e.message));
  // The model list is public.
  const list = await bad.models.list();
  assert.equal(list.data[0].id, 'lamina-counter');
});

await check('a bad request is a 400 naming the field', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'x', temperature: 'hot',
                                                        messages: [{ role: 'user', content: 'hi' }] }),
                       (e) => e.status === 400 && /temperature/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'x', messages: 'hi' }),
                       (e) => e.status === 400 && /messages/.test(e.message));
});

await check('a prompt over the slot context is a 400 exceed_context_size_error, also streaming', async () => {
  const long = 'one two three four five six seven eight nine ten '.repeat(120);
  for (const stream of [false, true]) {
    await assert.rejects(client.chat.completions.create({ model: 'x', stream, messages: [{ role: 'user', content: long }] }),
                         (e) => e.status === 400 && e.error?.type === 'exceed_context_size_error' &&
                                /512/.test(e.message));
  }
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather of a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] } },
      required: ['city'],
    },
  },
};
const toolAsk = [{ role: 'user', content: 'What is the weather in Paris?' }];

await check('tools with tool_choice "required": a tool call with JSON arguments', async () => {
  const r = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 200, tools: [weatherTool],
    tool_choice: 'required', messages: toolAsk,
  });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.match(call.id, /^call_/);
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  const args = JSON.parse(call.function.arguments);
  assert.ok(['Paris', 'Oslo'].includes(args.city), call.function.arguments);

  // The call and a tool answer go back in the next request.
  const next = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 20, tools: [weatherTool],
    messages: [...toolAsk, choice.message,
               { role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' }],
  });
  assert.ok(['stop', 'length', 'tool_calls'].includes(next.choices[0].finish_reason));
});

await check('streamed tool call: tool_calls deltas, finish_reason "tool_calls"', async () => {
  const stream = await client.chat.completions.create({
    model: 'lamina-counter', temperature: 0, max_tokens: 200, tools: [weatherTool],
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, stream: true,
    messages: toolAsk,
  });
  const calls = [];
  let content = '';
  let finish = null;
  for await (const c of stream) {
    const ch = c.choices[0];
    if (!ch) continue;
    content += ch.delta?.content ?? '';
    for (const d of ch.delta?.tool_calls ?? []) {
      if (!calls[d.index]) calls[d.index] = { id: d.id, name: '', arguments: '' };
      calls[d.index].name += d.function?.name ?? '';
      calls[d.index].arguments += d.function?.arguments ?? '';
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content.includes('<tool_call>'), false, content);
  assert.equal(calls.length, 1);
  assert.match(calls[0].id, /^call_/);
  assert.equal(calls[0].name, 'get_weather');
  assert.ok(['Paris', 'Oslo'].includes(JSON.parse(calls[0].arguments).city));
});

await check('malformed tools are a 400', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'x', tools: [{ type: 'function' }],
                                                        messages: toolAsk }),
                       (e) => e.status === 400 && /tools\[0\]\.function/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'x', tool_choice: 'required',
                                                        messages: toolAsk }),
                       (e) => e.status === 400 && /needs "tools"/.test(e.message));
});

await check('SIGTERM stops the server within a few seconds', async () => { await stopServer(server); });

finish(server);
