// OpenAI's Responses API through the real `openai` npm client against a real `lamina serve` (the
// shipped model, a free loopback port): a plain answer (output_text, status, usage), instructions
// and input items, the stream's typed events in order with their sequence numbers adding up to the
// same answer, max_output_tokens ending in "incomplete", a function call round trip (the call,
// then function_call_output back in the input), and errors in OpenAI's shape.
// Exit 0: pass; 77: skipped (the package is not installed); anything else: failure.
import assert from 'node:assert/strict';

import { checkRunner, startServer, stopServer, binary, model, requireClient } from './node_server.mjs';

const { OpenAI } = requireClient('openai');

const server = await startServer(binary, ['-m', model, '-c', '2048', '--alias', 'lamina-counter']);
const client = new OpenAI({ apiKey: 'none', baseURL: `${server.base}/v1` });
const { check, finish } = checkRunner();
const counted = (n) => Array.from({ length: n }, (_, i) => String(i + 1)).join('\n');
const ask = { model: 'lamina-counter', temperature: 0, input: 'Count from 1 to 5, one number per line.' };

let plain;
await check('responses.create: the answer as output_text, completed, with usage', async () => {
  plain = await client.responses.create(ask);
  assert.equal(plain.object, 'response');
  assert.ok(plain.id.startsWith('resp_'));
  assert.equal(plain.status, 'completed');
  assert.equal(plain.output_text, counted(5));
  assert.equal(plain.output.length, 1);
  assert.equal(plain.output[0].type, 'message');
  assert.equal(plain.output[0].content[0].type, 'output_text');
  assert.ok(plain.usage.input_tokens > 0 && plain.usage.output_tokens > 0);
  assert.equal(plain.usage.total_tokens, plain.usage.input_tokens + plain.usage.output_tokens);
});

await check('input items with instructions give the same answer as the string input', async () => {
  const r = await client.responses.create({
    model: 'lamina-counter', temperature: 0, instructions: undefined,
    input: [{ role: 'user', content: [{ type: 'input_text', text: ask.input }] }],
  });
  assert.equal(r.output_text, plain.output_text);
});

await check('stream: typed events in order, numbered, adding up to the same answer', async () => {
  const stream = await client.responses.create({ ...ask, stream: true });
  const types = [];
  let text = '', seq = -1, completed = null;
  for await (const e of stream) {
    types.push(e.type);
    assert.equal(e.sequence_number, seq + 1);
    seq = e.sequence_number;
    if (e.type === 'response.output_text.delta') text += e.delta;
    if (e.type === 'response.completed') completed = e.response;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.equal(types.at(-1), 'response.completed');
  for (const t of ['response.output_item.added', 'response.content_part.added',
                   'response.output_text.done', 'response.content_part.done',
                   'response.output_item.done']) {
    assert.ok(types.includes(t), t);
  }
  assert.equal(text, plain.output_text);
  assert.equal(completed.output[0].content[0].text, plain.output_text);
  assert.equal(completed.status, 'completed');
});

await check('max_output_tokens: status incomplete, reason max_output_tokens', async () => {
  const r = await client.responses.create({ ...ask, max_output_tokens: 3 });
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.usage.output_tokens, 3);
});

const weather = {
  type: 'function', name: 'get_weather', description: 'The weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] } },
                required: ['city'] },
};
await check('a function call round trip: the call, then its output back in the input', async () => {
  const input = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const r = await client.responses.create({
    model: 'lamina-counter', temperature: 0, max_output_tokens: 200, tools: [weather],
    tool_choice: { type: 'function', name: 'get_weather' }, input,
  });
  const call = r.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(r.output));
  assert.equal(call.name, 'get_weather');
  assert.ok(['Paris', 'Oslo'].includes(JSON.parse(call.arguments).city), call.arguments);
  assert.ok(call.call_id.length > 0);
  const next = await client.responses.create({
    model: 'lamina-counter', temperature: 0, max_output_tokens: 30, tools: [weather],
    input: [...input, call, { type: 'function_call_output', call_id: call.call_id, output: 'Sunny, 21 C' }],
  });
  assert.equal(next.status === 'completed' || next.status === 'incomplete', true);
  assert.equal(next.output.at(-1).type === 'message' || next.output.at(-1).type === 'function_call', true);
});

await check('errors: previous_response_id, a missing input and a web_search tool are 400s', async () => {
  await assert.rejects(client.responses.create({ ...ask, previous_response_id: 'resp_x' }),
                       (e) => e.status === 400 && /previous_response_id/.test(e.message));
  await assert.rejects(client.responses.create({ model: 'x' }),
                       (e) => e.status === 400 && /input/.test(e.message));
  await assert.rejects(client.responses.create({ ...ask, tools: [{ type: 'web_search' }] }),
                       (e) => e.status === 400 && /function tools/.test(e.message));
});

await check('SIGTERM stops the server', async () => { await stopServer(server); });
finish(server);
