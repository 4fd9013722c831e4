// Reasoning through the real `openai` npm client against a real `lamina serve` (the shipped
// model, a free loopback port) with a template whose generation prompt opens a <think> block when
// enable_thinking is on: the block comes back as reasoning_content (non-streamed, and streamed as
// its own deltas that add up to the same text), the thinking budget ends it (the forced close tag,
// then content), thinking off (chat_template_kwargs, reasoning_effort "none") gives none, the
// reasoning_format "none" and "deepseek-legacy" keep the block in content, a bad
// enable_thinking is a 400, the Responses API, Anthropic's Messages and Ollama's chat return
// the same thought in their own shapes (a reasoning item, a thinking block, message.thinking),
// and a Responses reasoning item sent back is rendered as that assistant turn's thinking.
// The server runs with --reasoning on: the template thinks only when enable_thinking is true.
// Exit 0: pass; 77: skipped (the package is not installed); anything else: failure.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { checkRunner, startServer, stopServer, streamedParts, binary, model, requireClient } from './node_server.mjs';

const { OpenAI } = requireClient('openai');

// ChatML whose generation prompt opens the thinking block, or closes an empty one when thinking
// is off (as Qwen3's template does), and which renders an assistant turn's reasoning_content.
const template = `{%- for message in messages -%}
{{ '<|im_start|>' + message['role'] + '\\n' }}
{%- if message.reasoning_content -%}{{ '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif -%}
{{ message['content'] + '<|im_end|>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}
{%- if enable_thinking -%}{{ '<think>\\n' }}{%- else -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}
{%- endif -%}`;
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lamina-reasoning-'));
const templateFile = path.join(dir, 'think.jinja');
fs.writeFileSync(templateFile, template);

const budget = 6;
const server = await startServer(binary, ['-m', model, '-c', '1024', '--chat-template-file',
                                          templateFile, '--reasoning-budget', String(budget),
                                          '--reasoning', 'on']);
const client = new OpenAI({ apiKey: 'none', baseURL: `${server.base}/v1` });
const { check, finish } = checkRunner();
const ask = {
  model: 'lamina-counter', temperature: 0, max_tokens: 24,
  messages: [{ role: 'user', content: 'Count from 1 to 5, one number per line.' }],
};
const tokenCount = async (text) => {
  const r = await fetch(`${server.base}/tokenize`, { method: 'POST', body: JSON.stringify({ content: text }) });
  return (await r.json()).tokens.length;
};

let whole;
await check('thinking on: reasoning_content apart, ended by the budget, then content', async () => {
  whole = (await client.chat.completions.create(ask)).choices[0].message;
  assert.ok(whole.reasoning_content && whole.reasoning_content.length > 0, JSON.stringify(whole));
  assert.ok(!whole.content.includes('<think>') && whole.content.length > 0, JSON.stringify(whole));
  assert.ok(await tokenCount(whole.reasoning_content) <= budget, whole.reasoning_content);
});

await check('streamed: reasoning_content deltas first, adding up to the same parts', async () => {
  const stream = await client.chat.completions.create({ ...ask, stream: true });
  const { reasoning, content } = await streamedParts(stream);
  assert.equal(reasoning, whole.reasoning_content);
  assert.equal(content, whole.content);
});

await check('thinking off (chat_template_kwargs, reasoning_effort "none"): no reasoning_content', async () => {
  for (const extra of [{ chat_template_kwargs: { enable_thinking: false } }, { reasoning_effort: 'none' }]) {
    const m = (await client.chat.completions.create({ ...ask, ...extra })).choices[0].message;
    assert.equal(m.reasoning_content, undefined, JSON.stringify(m));
    assert.ok(m.content.length > 0);
  }
});

await check('reasoning_format "none" and "deepseek-legacy" keep the block in content', async () => {
  const none = (await client.chat.completions.create({ ...ask, reasoning_format: 'none' })).choices[0].message;
  assert.equal(none.reasoning_content, undefined);
  assert.ok(none.content.includes('</think>'), none.content);
  const legacy = (await client.chat.completions.create({ ...ask, reasoning_format: 'deepseek-legacy' })).choices[0].message;
  assert.equal(legacy.reasoning_content, whole.reasoning_content);
  assert.ok(legacy.content.includes('</think>'), legacy.content);
});

await check('a budget per request: reasoning_budget_tokens 2 thinks less', async () => {
  const m = (await client.chat.completions.create({ ...ask, reasoning_budget_tokens: 2 })).choices[0].message;
  assert.ok(await tokenCount(m.reasoning_content) <= 2, m.reasoning_content);
  assert.ok(m.reasoning_content.length < whole.reasoning_content.length);
});

await check('a bad enable_thinking or reasoning_format is a 400 naming it', async () => {
  await assert.rejects(client.chat.completions.create({ ...ask, chat_template_kwargs: { enable_thinking: 'yes' } }),
                       (e) => e.status === 400 && /enable_thinking/.test(e.message));
  await assert.rejects(client.chat.completions.create({ ...ask, reasoning_format: 'r1' }),
                       (e) => e.status === 400 && /reasoning_format/.test(e.message));
});

const post = async (route, body) => {
  const r = await fetch(`${server.base}${route}`, { method: 'POST', body: JSON.stringify(body) });
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
};
await check('the other protocols: a Responses reasoning item, an Anthropic thinking block, Ollama\'s thinking', async () => {
  const r = await client.responses.create({ model: 'x', temperature: 0, max_output_tokens: 24, input: ask.messages[0].content });
  assert.equal(r.output[0].type, 'reasoning');
  assert.equal(r.output[0].content[0].text, whole.reasoning_content);
  assert.equal(r.output_text, whole.content);
  const a = await post('/v1/messages', { model: 'x', max_tokens: 24, temperature: 0, messages: ask.messages });
  assert.equal(a.content[0].type, 'thinking');
  assert.equal(a.content[0].thinking, whole.reasoning_content);
  assert.equal(a.content[1].text, whole.content);
  const off = await post('/v1/messages', { model: 'x', max_tokens: 24, temperature: 0, messages: ask.messages, thinking: { type: 'disabled' } });
  assert.equal(off.content[0].type, 'text');
  const o = await post('/api/chat', { model: 'x', stream: false, messages: ask.messages, options: { temperature: 0, num_predict: 24 } });
  assert.equal(o.message.thinking, whole.reasoning_content);
  assert.equal(o.message.content, whole.content);
  const noThink = await post('/api/chat', { model: 'x', stream: false, think: false, messages: ask.messages, options: { temperature: 0, num_predict: 24 } });
  assert.equal(noThink.message.thinking, undefined);
});

await check('Anthropic thinking blocks are signed; sent back intact they are the turn\'s thinking, edited they are left out', async () => {
  const a = await post('/v1/messages', { model: 'x', max_tokens: 24, temperature: 0, messages: ask.messages });
  const block = a.content[0];
  assert.equal(block.type, 'thinking');
  assert.match(block.signature, /^[A-Za-z0-9+/]{43}=$/);  // base64 of an HMAC-SHA256
  // Streamed: the signature_delta (last in the block) carries the same signature.
  const res = await fetch(`${server.base}/v1/messages`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'x', max_tokens: 24, temperature: 0, stream: true, messages: ask.messages }),
  });
  const events = (await res.text()).split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));
  const sig = events.filter((e) => e.type === 'content_block_delta' && e.delta.type === 'signature_delta');
  assert.equal(sig.length, 1);
  assert.equal(sig[0].delta.signature, block.signature);
  const turns = (thinking) => ({
    model: 'x', messages: [ask.messages[0],
      { role: 'assistant', content: [thinking, { type: 'text', text: a.content[1].text }] },
      { role: 'user', content: 'Go on.' }],
  });
  const tokens = async (body) => (await post('/v1/messages/count_tokens', body)).input_tokens;
  const kept = await tokens(turns(block));
  const edited = await tokens(turns({ ...block, thinking: block.thinking + ' 6' }));
  const forged = await tokens(turns({ ...block, signature: 'A'.repeat(43) + '=' }));
  const none = await tokens(turns({ type: 'text', text: '' }));
  assert.equal(edited, none, 'an edited thinking block was used');
  assert.equal(forged, none, 'a forged signature was accepted');
  assert.ok(kept > none + 3, `the signed thinking was not rendered (${kept} vs ${none} tokens)`);
  // The OpenAI shape: an assistant turn's reasoning_content is rendered the same way.
  const t = await post('/apply-template', { messages: [ask.messages[0],
    { role: 'assistant', content: 'x', reasoning_content: block.thinking }, { role: 'user', content: 'Go on.' }] });
  assert.ok(t.prompt.includes('<think>\n' + block.thinking + '\n</think>'), t.prompt);
  const bad = await fetch(`${server.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi', reasoning_content: 'no' }] }),
  });
  assert.equal(bad.status, 400);
});

await check('a Responses reasoning item is the next assistant turn\'s thinking in the prompt', async () => {
  const input = (reasoning) => [
    { role: 'user', content: ask.messages[0].content },
    ...(reasoning ? [{ type: 'reasoning', id: 'rs_1', summary: [], content: [{ type: 'reasoning_text', text: whole.reasoning_content }] }] : []),
    { role: 'assistant', content: [{ type: 'output_text', text: whole.content }] },
    { role: 'user', content: 'Go on.' },
  ];
  const used = async (reasoning) => (await client.responses.create({ model: 'x', temperature: 0, max_output_tokens: 2,
                                                                     input: input(reasoning) })).usage.input_tokens;
  const withThought = await used(true), without = await used(false);
  assert.ok(withThought >= without + await tokenCount(whole.reasoning_content), `${withThought} vs ${without} tokens`);
});

await check('SIGTERM stops the server', async () => { await stopServer(server); });
fs.rmSync(dir, { recursive: true, force: true });
finish(server);
