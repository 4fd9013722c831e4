// Drives a real `lamina serve` (the shipped model, a free loopback port) with the real `ollama`
// npm package: /api/chat streamed (the default) and not, /api/generate streamed and raw,
// format "json", options (num_predict, stop), a forced tool call, /api/tags, /api/show, /api/ps
// and /api/version, and the API key (tags and version public, the others not).
// Exit 0: pass; 77: skipped (the package is not installed); anything else: failure.
import assert from 'node:assert/strict';

import { startServer, stopServer, binary, model, requireClient, checkRunner } from './node_server.mjs';

const { Ollama } = requireClient('ollama');

const count = (n) => Array.from({ length: n }, (_, i) => String(i + 1)).join('\n');
const countPrompt = 'Count from 1 to 5, one number per line.';
const countAsk = [{ role: 'user', content: countPrompt }];
const { check, finish } = checkRunner();

const key = 'sk-lamina-test';
const server = await startServer(binary, ['-m', model, '-np', '2', '-c', '2048', '--alias',
                                          'lamina-counter', '--api-key', key]);
const client = new Ollama({ host: server.base, headers: { Authorization: `Bearer ${key}` } });
const opts = { temperature: 0, num_predict: 100 };

let plain;
await check('chat (stream: false) counts at temperature 0, with Ollama\'s counters', async () => {
  plain = await client.chat({ model: 'lamina-counter', messages: countAsk, options: opts,
                              stream: false });
  assert.equal(plain.model, 'lamina-counter');
  assert.equal(plain.message.role, 'assistant');
  assert.equal(plain.message.content, count(5));
  assert.equal(plain.done, true);
  assert.equal(plain.done_reason, 'stop');
  assert.ok(plain.prompt_eval_count > 0 && plain.eval_count > 0);
  assert.ok(plain.total_duration >= plain.eval_duration && plain.eval_duration > 0);
  assert.ok(!Number.isNaN(Date.parse(plain.created_at)));
});

await check('chat streamed: message pieces, then one done object', async () => {
  const stream = await client.chat({ model: 'lamina-counter', messages: countAsk, options: opts,
                                     stream: true });
  const parts = [];
  for await (const p of stream) parts.push(p);
  assert.ok(parts.length > 2);
  assert.equal(parts.map((p) => p.message.content).join(''), count(5));
  for (const p of parts.slice(0, -1)) assert.equal(p.done, false);
  const last = parts.at(-1);
  assert.equal(last.done, true);
  assert.equal(last.done_reason, 'stop');
  assert.equal(last.eval_count, plain.eval_count);
});

await check('a plain POST /api/chat streams NDJSON by default', async () => {
  const r = await fetch(`${server.base}/api/chat`, {
    method: 'POST', headers: { Authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: 'x', messages: countAsk, options: opts }),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /application\/x-ndjson/);
  const lines = (await r.text()).trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(lines.map((l) => l.message.content).join(''), count(5));
  assert.equal(lines.at(-1).done, true);
});

await check('options.num_predict: done_reason "length"', async () => {
  const r = await client.chat({ model: 'x', messages: countAsk, stream: false,
                                options: { temperature: 0, num_predict: 3 } });
  assert.equal(r.done_reason, 'length');
  assert.equal(r.eval_count, 3);
  assert.ok(count(5).startsWith(r.message.content));
});

await check('options.stop stops before the stop string', async () => {
  const r = await client.chat({ model: 'x', messages: countAsk, stream: false,
                                options: { ...opts, stop: ['3'] } });
  assert.equal(r.message.content, '1\n2\n');
});

await check('generate streamed: response pieces count', async () => {
  const stream = await client.generate({ model: 'x', prompt: countPrompt, options: opts,
                                         stream: true });
  let text = '', last;
  for await (const p of stream) {
    text += p.response;
    last = p;
  }
  assert.equal(text, count(5));
  assert.equal(last.done, true);
  assert.equal(last.done_reason, 'stop');
});

await check('generate raw: the prompt as given, continued', async () => {
  const r = await client.generate({ model: 'x', raw: true, stream: false, options: opts,
                                    prompt: `<|im_start|>user\n${countPrompt}<|im_end|>\n` +
                                            '<|im_start|>assistant\n1\n2\n' });
  assert.ok(r.response.startsWith('3\n4\n5'), r.response);
});

await check('format "json": the answer parses as a JSON object', async () => {
  const ask = [{ role: 'user', content: 'Write a JSON object with the fields "name" = "Bob", "age" = 7.' }];
  const r = await client.chat({ model: 'x', messages: ask, format: 'json', stream: false,
                                options: { temperature: 0, num_predict: 60 } });
  const obj = JSON.parse(r.message.content);
  assert.ok(typeof obj === 'object' && obj !== null && !Array.isArray(obj), r.message.content);
});

await check('tools: a forced tool call comes back as message.tool_calls', async () => {
  const r = await client.chat({
    model: 'x', stream: false, options: { temperature: 0, num_predict: 200 },
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'The weather',
                                            parameters: { type: 'object', required: ['city'],
                                                          properties: { city: { type: 'string',
                                                            enum: ['Paris', 'Oslo'] } } } } }],
  });
  // tool_choice is not an Ollama field: the model decides; if it calls, the call is parsed.
  for (const c of r.message.tool_calls ?? []) {
    assert.equal(c.function.name, 'get_weather');
    assert.equal(typeof c.function.arguments, 'object');
  }
  assert.equal(r.message.content.includes('<tool_call>'), false, r.message.content);
});

await check('tags, ps, show, version', async () => {
  const tags = await client.list();
  assert.equal(tags.models.length, 1);
  const m = tags.models[0];
  assert.equal(m.name, 'lamina-counter');
  assert.equal(m.details.format, 'gguf');
  assert.equal(m.details.family, 'llama');
  assert.match(m.details.parameter_size, /^[0-9.]+[MB]$/);
  assert.ok(m.size > 0);
  assert.match(m.digest, /^[0-9a-f]{64}$/);
  const ps = await client.ps();
  assert.equal(ps.models[0].name, 'lamina-counter');
  const show = await client.show({ model: 'lamina-counter' });
  assert.equal(show.details.format, 'gguf');
  assert.equal(show.model_info['general.architecture'], 'llama');
  assert.ok(show.template.length > 0);
  const v = await client.version();
  assert.match(v.version, /^\d+\.\d+\.\d+$/);
});

await check('the API key: tags and version public, chat/show/ps need it', async () => {
  const anon = new Ollama({ host: server.base });
  assert.equal((await anon.list()).models.length, 1);
  assert.ok((await anon.version()).version);
  await assert.rejects(anon.chat({ model: 'x', messages: countAsk, stream: false }),
                       (e) => e.status_code === 401 && /Invalid API Key/.test(e.error));
  await assert.rejects(anon.ps(), (e) => e.status_code === 401);
});

await check('a bad request is a 400 with Ollama\'s {"error"}', async () => {
  await assert.rejects(client.chat({ model: 'x', messages: 'nope', stream: false }),
                       (e) => e.status_code === 400 && /messages/.test(e.error));
});

await check('SIGTERM stops the server', async () => { await stopServer(server); });

finish(server);
