// Drives a real `lamina serve` (the shipped model, a free loopback port) with the real
// @anthropic-ai/sdk npm package: /v1/messages plain and streamed, max_tokens required (400 in
// Anthropic's error shape), a wrong x-api-key, a forced tool_use and its tool_result turn, a
// streamed tool_use (input_json_delta), stop_sequences, and /v1/messages/count_tokens.
// Exit 0: pass; 77: skipped (the package is not installed); anything else: failure.
import assert from 'node:assert/strict';

import { startServer, stopServer, binary, model, requireClient, checkRunner } from './node_server.mjs';

const sdk = requireClient('@anthropic-ai/sdk');
const Anthropic = sdk.default ?? sdk.Anthropic ?? sdk;

const count = (n) => Array.from({ length: n }, (_, i) => String(i + 1)).join('\n');
const countAsk = [{ role: 'user', content: 'Count from 1 to 5, one number per line.' }];
const { check, finish } = checkRunner();

const key = 'sk-lamina-test';
const server = await startServer(binary, ['-m', model, '-np', '2', '-c', '2048', '--alias',
                                          'lamina-counter', '--api-key', key]);
const client = new Anthropic({ baseURL: server.base, apiKey: key, maxRetries: 0 });

let plain;
await check('messages.create counts at temperature 0', async () => {
  plain = await client.messages.create({
    model: 'lamina-counter', max_tokens: 100, temperature: 0, messages: countAsk,
  });
  assert.equal(plain.type, 'message');
  assert.equal(plain.role, 'assistant');
  assert.match(plain.id, /^msg_/);
  assert.equal(plain.model, 'lamina-counter');
  assert.equal(plain.content.length, 1);
  assert.equal(plain.content[0].type, 'text');
  assert.equal(plain.content[0].text, count(5));
  assert.equal(plain.stop_reason, 'end_turn');
  assert.equal(plain.stop_sequence, null);
  assert.ok(plain.usage.input_tokens > 0 && plain.usage.output_tokens > 0);
});

await check('a system prompt as text blocks, and max_tokens stops with "max_tokens"', async () => {
  const r = await client.messages.create({
    model: 'lamina-counter', max_tokens: 3, temperature: 0, messages: countAsk,
    system: [{ type: 'text', text: 'You count.' }],
  });
  assert.equal(r.stop_reason, 'max_tokens');
  assert.equal(r.usage.output_tokens, 3);
  assert.ok(count(5).startsWith(r.content[0].text), r.content[0].text);
});

await check('stop_sequences: stop_reason "stop_sequence" with the sequence', async () => {
  const r = await client.messages.create({
    model: 'lamina-counter', max_tokens: 100, temperature: 0, messages: countAsk,
    stop_sequences: ['3'],
  });
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, '3');
  assert.equal(r.content[0].text, '1\n2\n');
});

await check('streamed messages: the events in order, the text equals the plain answer', async () => {
  const stream = await client.messages.create({
    model: 'lamina-counter', max_tokens: 100, temperature: 0, messages: countAsk, stream: true,
  });
  const types = [];
  let text = '';
  let stop = null, outputTokens = 0;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'content_block_delta') {
      assert.equal(ev.delta.type, 'text_delta');
      text += ev.delta.text;
    }
    if (ev.type === 'message_delta') {
      stop = ev.delta.stop_reason;
      outputTokens = ev.usage.output_tokens;
    }
  }
  assert.equal(text, count(5));
  assert.deepEqual(types.slice(0, 2), ['message_start', 'content_block_start']);
  assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.equal(stop, 'end_turn');
  assert.equal(outputTokens, plain.usage.output_tokens);
});

await check('messages.stream helper: finalMessage equals the plain answer', async () => {
  const final = await client.messages.stream({
    model: 'lamina-counter', max_tokens: 100, temperature: 0, messages: countAsk,
  }).finalMessage();
  assert.equal(final.content[0].text, count(5));
  assert.equal(final.stop_reason, 'end_turn');
});

await check('a missing max_tokens is a 400 in Anthropic\'s error shape', async () => {
  const r = await fetch(`${server.base}/v1/messages`, {
    method: 'POST', headers: { 'x-api-key': key, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'x', messages: countAsk }),
  });
  assert.equal(r.status, 400);
  const body = await r.json();
  assert.equal(body.type, 'error');
  assert.equal(body.error.type, 'invalid_request_error');
  assert.match(body.error.message, /max_tokens/);
  await assert.rejects(client.messages.create({ model: 'x', messages: countAsk }),
                       (e) => e.status === 400);
});

await check('a wrong x-api-key is a 401 (authentication_error)', async () => {
  const bad = new Anthropic({ baseURL: server.base, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model: 'x', max_tokens: 5, messages: countAsk }),
                       (e) => e.status === 401 && e.error?.error?.type === 'authentication_error');
});

const weather = {
  name: 'get_weather',
  description: 'The weather of a city',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] } },
    required: ['city'],
  },
};
const toolAsk = [{ role: 'user', content: 'What is the weather in Paris?' }];

await check('tool_choice {type: "tool"}: a tool_use block, then the tool_result answered',
            async () => {
  const r = await client.messages.create({
    model: 'lamina-counter', max_tokens: 200, temperature: 0, tools: [weather],
    tool_choice: { type: 'tool', name: 'get_weather' }, messages: toolAsk,
  });
  assert.equal(r.stop_reason, 'tool_use');
  const use = r.content.find((b) => b.type === 'tool_use');
  assert.ok(use, JSON.stringify(r.content));
  assert.match(use.id, /^toolu_/);
  assert.equal(use.name, 'get_weather');
  assert.ok(['Paris', 'Oslo'].includes(use.input.city), JSON.stringify(use.input));
  const next = await client.messages.create({
    model: 'lamina-counter', max_tokens: 20, temperature: 0, tools: [weather],
    messages: [...toolAsk, { role: 'assistant', content: r.content },
               { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id,
                                           content: '21 degrees' }] }],
  });
  assert.equal(next.type, 'message');
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(next.stop_reason), next.stop_reason);
  assert.ok(next.usage.input_tokens > r.usage.input_tokens);
});

await check('streamed tool_use: input_json_delta, stop_reason "tool_use"', async () => {
  const stream = await client.messages.create({
    model: 'lamina-counter', max_tokens: 200, temperature: 0, tools: [weather],
    tool_choice: { type: 'any' }, messages: toolAsk, stream: true,
  });
  let json = '', name = '', stop = null, text = '';
  for await (const ev of stream) {
    if (ev.type === 'content_block_start' && ev.content_block.type === 'tool_use')
      name = ev.content_block.name;
    if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta')
      json += ev.delta.partial_json;
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
    if (ev.type === 'message_delta') stop = ev.delta.stop_reason;
  }
  assert.equal(stop, 'tool_use');
  assert.equal(name, 'get_weather');
  assert.equal(text.includes('<tool_call>'), false, text);
  assert.ok(['Paris', 'Oslo'].includes(JSON.parse(json).city), json);
});

await check('count_tokens: the prompt tokens of a request, tools counted', async () => {
  const a = await client.messages.countTokens({ model: 'lamina-counter', messages: countAsk });
  assert.equal(a.input_tokens, plain.usage.input_tokens);
  const b = await client.messages.countTokens({ model: 'x', messages: toolAsk, tools: [weather] });
  assert.ok(b.input_tokens > a.input_tokens);
});

await check('SIGTERM stops the server', async () => { await stopServer(server); });

finish(server);
