// The shipped thinking model (lamina-counter-think.gguf) through real clients against a real
// `lamina serve` (its own chat template, the default --reasoning auto): thinking is off unless a request turns it on,
// and then the model writes its plan in a <think> block before the answer — "I count from 1 to 5
// and stop at 5." — which comes back as reasoning_content (whole and streamed), as a Responses
// reasoning item, an Anthropic thinking block and Ollama's message.thinking, with the answer
// unchanged. A budget ends the thought after exactly that many tokens. A Responses reasoning item
// sent back as input is the next assistant turn's thinking.
// Exit 0: pass; 77: skipped (the package is not installed); anything else: failure.
import assert from 'node:assert/strict';

import path from 'node:path';

import { checkRunner, startServer, stopServer, streamedParts, binary, repo, requireClient } from './node_server.mjs';

const { OpenAI } = requireClient('openai');

// The shipped model fine-tuned with its thinking mode (models/README.md, "lamina-counter-think").
const model = path.join(repo, 'models/lamina-counter-think.gguf');
const server = await startServer(binary, ['-m', model, '-c', '1024']);
const client = new OpenAI({ apiKey: 'none', baseURL: `${server.base}/v1` });
const { check, finish } = checkRunner();
const question = 'Count from 1 to 5, one number per line.';
const plan = 'I count from 1 to 5 and stop at 5.';
const answer = '1\n2\n3\n4\n5';
const ask = {
  model: 'lamina-counter', temperature: 0, max_tokens: 64,
  messages: [{ role: 'user', content: question }],
};
const on = { chat_template_kwargs: { enable_thinking: true } };
const post = async (route, body) => {
  const r = await fetch(`${server.base}${route}`, { method: 'POST', body: JSON.stringify(body) });
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
};
const tokenCount = async (text) => (await post('/tokenize', { content: text })).tokens.length;

await check('by default the shipped model answers without thinking', async () => {
  const m = (await client.chat.completions.create(ask)).choices[0].message;
  assert.equal(m.reasoning_content, undefined, JSON.stringify(m));
  assert.equal(m.content, answer);
  const prompt = (await post('/apply-template', { messages: ask.messages })).prompt;
  assert.ok(!prompt.includes('<think>'), prompt);
});

await check('thinking on (enable_thinking, reasoning_effort): the plan as reasoning_content, then the answer', async () => {
  for (const extra of [on, { reasoning_effort: 'low' }]) {
    const m = (await client.chat.completions.create({ ...ask, ...extra })).choices[0].message;
    assert.equal(m.reasoning_content, plan, JSON.stringify(m));
    assert.equal(m.content, answer);
  }
});

await check('streamed: the plan in reasoning_content deltas before the content deltas', async () => {
  const stream = await client.chat.completions.create({ ...ask, ...on, stream: true });
  const { reasoning, content } = await streamedParts(stream);
  assert.equal(reasoning, plan);
  assert.equal(content, answer);
});

await check('a budget ends the thought after exactly that many tokens', async () => {
  const full = await tokenCount(plan);
  for (const budget of [1, 3, 5]) {
    assert.ok(budget < full);
    const r = await post('/v1/chat/completions', { ...ask, ...on, reasoning_budget_tokens: budget, reasoning_format: 'none' });
    const text = r.choices[0].message.content;
    const thought = text.slice(0, text.indexOf('</think>'));
    assert.equal(await tokenCount(thought), budget, JSON.stringify(text));
  }
});

await check('the other protocols: a Responses reasoning item, an Anthropic thinking block, Ollama\'s thinking', async () => {
  const r = await client.responses.create({ model: 'x', temperature: 0, max_output_tokens: 64, input: question,
                                            reasoning: { effort: 'medium' } });
  assert.equal(r.output[0].type, 'reasoning');
  assert.equal(r.output[0].content[0].text, plan);
  assert.equal(r.output_text, answer);
  const plain = await client.responses.create({ model: 'x', temperature: 0, max_output_tokens: 64, input: question });
  assert.equal(plain.output[0].type, 'message');
  const a = await post('/v1/messages', { model: 'x', max_tokens: 64, temperature: 0, messages: ask.messages,
                                         thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.equal(a.content[0].type, 'thinking');
  assert.equal(a.content[0].thinking, plan);
  assert.equal(a.content[1].text, answer);
  const o = await post('/api/chat', { model: 'x', stream: false, think: true, messages: ask.messages,
                                      options: { temperature: 0, num_predict: 64 } });
  assert.equal(o.message.thinking, plan);
  assert.equal(o.message.content, answer);
});

await check('a conversation with a Responses reasoning item in its input goes on; a bad one is a 400', async () => {
  const input = [
    { role: 'user', content: question },
    { type: 'reasoning', id: 'rs_1', summary: [], content: [{ type: 'reasoning_text', text: plan }] },
    { role: 'assistant', content: [{ type: 'output_text', text: answer }] },
    { role: 'user', content: 'Go on.' },
  ];
  const r = await client.responses.create({ model: 'x', temperature: 0, max_output_tokens: 32, input });
  assert.ok(r.output_text.length > 0, JSON.stringify(r));
  const bad = await fetch(`${server.base}/v1/responses`, {
    method: 'POST', body: JSON.stringify({ input: [{ type: 'reasoning', content: [{ type: 'reasoning_text' }] }] }),
  });
  assert.equal(bad.status, 400);
  assert.match(await bad.text(), /input\[0\]\.content\[0\]\.text must be a string/);
});

await check('SIGTERM stops the server', async () => { await stopServer(server); });
finish(server);
