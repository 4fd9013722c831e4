// Drives the web page of a real `lamina serve` (the shipped model, a free loopback port) in real
// headless Chromium through the npm package playwright-core (tests/node): the page's files and
// their types, the chat streams a greedy count from 1 to 12 with temperature 0 set in the
// settings, Stop aborts a long answer at once, a 5,000-token answer streams without a long task
// on the main thread, Markdown renders (a canned stream: headings, lists, a code block, a table)
// while HTML and javascript: links in an answer stay text, no marked.min.js means plain text,
// reload keeps the chats (list, switch, copy, export), dark mode, New chat clears the thread, the
// monitor tab shows the slots and the recent requests, with --api-key the page shows the 401
// until the key is entered in its settings, a thinking model's reasoning_content shows in a
// collapsed "Thinking" block, and the status dot turns red when the server dies.
// SCREENSHOT=1 saves the chat (1200x800) to docs/web-ui.png.
// Env: LAMINA_BINARY, LAMINA_MODEL (defaults: build/release/lamina, models/lamina-counter.gguf
// under the repo root), CHROMIUM (default: /usr/bin/chromium, then chromium-browser).
// Exit 0: pass; 77: skipped (no Chromium or no playwright-core); anything else: failure.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { startServer as startLamina, stopServer as stopLamina } from './node_server.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..');
const binary = process.env.LAMINA_BINARY || path.join(repo, 'build/release/lamina');
const model = process.env.LAMINA_MODEL || path.join(repo, 'models/lamina-counter.gguf');
const t0 = Date.now();

const chromiumPath = [process.env.CHROMIUM, '/usr/bin/chromium', '/usr/bin/chromium-browser']
  .find((p) => p && fs.existsSync(p));
if (!chromiumPath) {
  console.log('SKIP: Chromium is not installed (apt-get install chromium, or set CHROMIUM)');
  process.exit(77);
}
let chromium;
try {
  // Resolved from tests/node only: never a browser download, never a global install.
  const require = createRequire(path.join(here, 'node', 'package.json'));
  ({ chromium } = require('playwright-core'));
} catch {
  console.log('SKIP: the playwright-core package is not installed (npm ci --prefix tests/node)');
  process.exit(77);
}
for (const [what, p] of [['LAMINA_BINARY', binary], ['LAMINA_MODEL', model]]) {
  if (!fs.existsSync(p)) {
    console.log(`FAIL: ${what} ${p} does not exist (build the lamina target first)`);
    process.exit(1);
  }
}

// Everything this test started, ended on any exit.
const servers = new Set();
let profileDir = null;
let context = null;
process.on('exit', () => {
  for (const s of servers) s.proc.kill('SIGKILL');
  if (profileDir) fs.rmSync(profileDir, { recursive: true, force: true });
});
const watchdog = setTimeout(() => {
  console.log(`FAIL: the test ran past 90 s${current ? ` (in: ${current})` : ''}`);
  for (const s of servers) console.log(`server log:\n${s.log()}`);
  process.exit(1);
}, 90_000);

// 6144 cells a slot: room for the 5,000-token answer.
const everStarted = [];  // bases of the servers this test started, the killed one included
const startServer = async (extra = []) => {
  const s = await startLamina(binary, ['-m', model, '-np', '2', '-c', '12288', ...extra], servers);
  everStarted.push(s.base);
  return s;
};
const stopServer = (s) => stopLamina(s, servers);

let current = '';
let passed = 0;
async function step(name, fn) {
  current = name;
  try {
    await fn();
    ++passed;
    console.log(`ok   ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } catch (e) {
    console.log(`FAIL ${name}: ${e.stack || e}`);
    for (const s of servers) console.log(`server log:\n${s.log()}`);
    if (context) await context.close().catch(() => {});
    console.log(`web_ui: ${passed} passed, 1 failed`);
    process.exit(1);
  }
}

const count = (n) => Array.from({ length: n }, (_, i) => String(i + 1)).join('\n');
const countPrompt = (n) => `Count from 1 to ${n}, one number per line.`;
async function waitAnswer(page, nth, timeout = 20_000) {
  const m = page.locator('#messages .msg.assistant').nth(nth);
  await m.and(page.locator('.done')).waitFor({ timeout });
  await page.locator('#send:not([disabled])').waitFor({ timeout: 2000 });
  return {
    text: await m.locator('.content').innerText(),
    meta: await m.locator('.meta').textContent(),
    error: (await m.locator('.error').count()) ? await m.locator('.error').textContent() : null,
  };
}

let server;
let page;
let markedEmbedded = false;
let thinker;  // the server of the thinking model, killed to turn the status dot red
const pageErrors = [];

await step('the server starts and is healthy', async () => { server = await startServer(); });

await step('Chromium opens the page', async () => {
  profileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lamina-web-ui-'));
  context = await chromium.launchPersistentContext(profileDir, {
    executablePath: chromiumPath,
    headless: true,
    viewport: { width: 1200, height: 800 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    timeout: 20_000,
  });
  page = context.pages()[0] ?? await context.newPage();
  page.setDefaultTimeout(10_000);
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  // The page is self-contained: any request off the server is a failure.
  page.on('request', (r) => {
    const url = r.url();
    if (!/^(data|blob):/.test(url) && !everStarted.some((base) => url.startsWith(`${base}/`))) {
      pageErrors.push(`external request ${url}`);
    }
  });
  const res = await page.goto(`${server.base}/`);
  assert.equal(res.status(), 200);
  assert.equal(await page.title(), 'lamina');
  for (const id of ['#input', '#send', '#messages', '#tab-chat', '#tab-monitor', '#temperature', '#new-chat']) {
    assert.equal(await page.locator(id).count(), 1, `${id} is on the page`);
  }
  // /props fills the header's model name; /health turns the status dot green.
  await page.locator('#model-name', { hasText: /\S/ }).waitFor();
  await page.locator('#health-dot.up').waitFor();
});

await step('the page\'s files are served with their types; marked is embedded', async () => {
  const types = { '/': 'text/html', '/index.html': 'text/html', '/app.js': 'text/javascript',
                  '/markdown.js': 'text/javascript', '/style.css': 'text/css' };
  for (const [file, type] of Object.entries(types)) {
    const r = await fetch(`${server.base}${file}`);
    assert.equal(r.status, 200, `${file}: ${r.status}`);
    assert.equal(r.headers.get('content-type'), `${type}; charset=utf-8`, file);
  }
  // Built without libjs-marked, the page shows answers as text; the Markdown checks then skip.
  markedEmbedded = (await fetch(`${server.base}/marked.min.js`)).status === 200;
  assert.equal(await page.evaluate(() => typeof window.marked?.parse), markedEmbedded ? 'function' : 'undefined');
  if (!markedEmbedded) console.log('     (no marked.min.js in this build: the Markdown checks skip)');
});

await step('Shift+Enter is a newline, not a send', async () => {
  await page.locator('#input').fill('one');
  await page.locator('#input').press('Shift+Enter');
  await page.locator('#input').pressSequentially('two');
  assert.equal(await page.locator('#input').inputValue(), 'one\ntwo');
  assert.equal(await page.locator('#messages .msg').count(), 0);
  await page.locator('#input').fill('');
});

await step('the chat streams a greedy count from 1 to 12, with timings', async () => {
  await page.locator('#temperature').fill('0');
  await page.locator('#input').fill(countPrompt(12));
  await page.locator('#send').click();
  assert.equal(await page.locator('#messages .msg.user .content').last().textContent(), countPrompt(12));
  const a = await waitAnswer(page, 0);
  assert.equal(a.error, null, `no error line: ${a.error}`);
  assert.equal(a.text.trim(), count(12));
  assert.match(a.meta, /^\d+ tokens · \d+(\.\d+)? tok\/s/, `the stats line: ${a.meta}`);
});

if (process.env.SCREENSHOT === '1') {
  await step('a screenshot of the chat in docs/web-ui.png', async () => {
    await page.locator('#input').fill('');
    await page.mouse.move(0, 0);
    await page.screenshot({ path: path.join(repo, 'docs/web-ui.png') });
  });
}

await step('Stop aborts a long answer at once and the page takes the next one', async () => {
  // The click on Stop comes from inside the page as soon as the answer shows 200 characters
  // (about 100 of the 1000 numbers), so the answer cannot finish first; the page stamps the
  // click and the moment the answer is marked done.
  await page.evaluate(() => {
    const thread = document.getElementById('messages');
    const watch = new MutationObserver(() => {
      const m = thread.querySelectorAll('.msg.assistant')[1];
      if (!m) return;
      if (!window.__stopAt && m.querySelector('.content').textContent.length >= 200) {
        window.__stopAt = performance.now();
        document.getElementById('stop').click();
      }
      if (window.__stopAt && m.classList.contains('done')) {
        window.__doneAt = performance.now();
        watch.disconnect();
      }
    });
    watch.observe(thread, { childList: true, subtree: true, characterData: true, attributes: true });
  });
  await page.locator('#input').fill(countPrompt(1000));
  await page.locator('#input').press('Enter');
  const a = await waitAnswer(page, 1, 10_000);
  assert.match(a.meta, /stopped/, `the stats line says stopped: ${a.meta}`);
  assert.equal(a.error, null);
  assert.ok(a.text.startsWith('1\n2\n3'), `a partial count: ${a.text.slice(0, 40)}`);
  assert.ok(!a.text.includes('\n1000'), 'the count did not finish');
  const ms = await page.evaluate(() => window.__doneAt - window.__stopAt);
  console.log(`     Stop → answer done: ${ms.toFixed(1)} ms`);
  assert.ok(ms < 200, `Stop took ${ms} ms`);
});

await step('a 5,000-token answer streams without a long task on the main thread', async () => {
  await page.locator('#new-chat').click();
  await page.locator('#max_tokens').fill('5000');
  // The real server, asked to go on past its end of text: exactly 5,000 tokens.
  await page.route('**/v1/chat/completions', (route) => {
    const body = JSON.parse(route.request().postData());
    route.continue({ postData: JSON.stringify({ ...body, ignore_eos: true }) });
  });
  // Until the answer is marked done: the main thread's long tasks (over 50 ms, from the
  // PerformanceObserver) and the longest gap between two animation frames. The test's own reads
  // of the page come after and are not counted.
  await page.evaluate(() => {
    const perf = window.__perf = { tasks: [], frameGap: 0, doneAt: Infinity };
    perf.observer = new PerformanceObserver((list) => {
      for (const e of list.getEntries()) perf.tasks.push({ start: e.startTime, ms: e.duration });
    });
    perf.observer.observe({ type: 'longtask' });
    let lastFrame = performance.now();
    const frame = (now) => {
      perf.frameGap = Math.max(perf.frameGap, now - lastFrame);
      lastFrame = now;
      if (perf.doneAt === Infinity) requestAnimationFrame(frame);
    };
    requestAnimationFrame(frame);
    const thread = document.getElementById('messages');
    const watch = new MutationObserver(() => {
      if (thread.querySelector('.msg.assistant.done')) {
        perf.doneAt = performance.now();
        watch.disconnect();
      }
    });
    watch.observe(thread, { subtree: true, attributes: true, attributeFilter: ['class'] });
  });
  const t1 = Date.now();
  await page.locator('#input').fill(countPrompt(3000));
  await page.locator('#input').press('Enter');
  const a = await waitAnswer(page, 0, 60_000);
  const secs = (Date.now() - t1) / 1000;
  const perf = await page.evaluate(() => {
    const p = window.__perf;
    p.observer.disconnect();
    const tasks = p.tasks.filter((t) => t.start < p.doneAt);
    return { longest: Math.max(0, ...tasks.map((t) => t.ms)), longTasks: tasks.length,
             frameGap: p.frameGap,
             segments: document.querySelectorAll('.msg.assistant .seg').length,
             leftovers: document.querySelectorAll('.msg.assistant :is(.seg.tail, .seg:empty)').length };
  });
  await page.unroute('**/v1/chat/completions');
  await page.locator('#max_tokens').fill('');
  await page.locator('#max_tokens').dispatchEvent('change');
  console.log(`     ${secs.toFixed(1)} s; longest task ${perf.longest.toFixed(0)} ms ` +
              `(${perf.longTasks} over 50 ms); longest frame gap ${perf.frameGap.toFixed(0)} ms; ` +
              `${perf.segments} segments`);
  assert.equal(a.error, null);
  assert.match(a.meta, /^5000 tokens .*finish: length/, `the stats line: ${a.meta}`);
  assert.ok(a.text.startsWith('1\n2\n3\n'), a.text.slice(0, 20));
  assert.ok(perf.segments > 50, `rendered in segments, not as one block: ${perf.segments}`);
  assert.equal(perf.leftovers, 0, 'no unfinished or empty segment is left');
  // On an idle 2-core machine this page has at most a task or two just over 50 ms (the page
  // that set the whole text on every token: 57, up to 1.1 s each); the bounds leave room for a
  // machine busy with other work.
  assert.ok(perf.longest < 500, `the longest task took ${perf.longest} ms`);
  assert.ok(perf.frameGap < 1000, `no frame for ${perf.frameGap} ms`);
});

// A canned answer (the page's fetch answered by the test): Markdown, HTML that must stay text,
// and a code block long enough to be rendered in several segments.
const longCode = Array.from({ length: 100 }, (_, i) => `print(${i}, "<i>")`);
const cannedAnswer = [
  '# Shopping list', '', 'Some **bold**, *slanted* and `inline code`.', '', '- one', '- two', '',
  '```js', "const tag = '<b>not bold</b>';", '```', '',
  '<script>window.__pwned = 1</script>', '',
  '<img src=x onerror="window.__pwned = 2">', '',
  '[a bad link](javascript:window.__pwned=3) and [a good one](https://example.com/)', '',
  '| a | b |', '|---|---|', '| 1 | 2 |', '',
  '```python', ...longCode, '```', '', 'The end.',
].join('\n');
function cannedStream(text) {
  const chunk = (delta, finish = null) =>
    `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
  let body = chunk({ role: 'assistant', content: '' });
  for (let i = 0; i < text.length; i += 3) body += chunk({ content: text.slice(i, i + 3) });
  return body + chunk({}, 'stop') + 'data: [DONE]\n\n';
}

await step('Markdown renders; HTML and javascript: links in an answer stay text', async () => {
  await page.locator('#new-chat').click();
  await page.route('**/v1/chat/completions', (route) => route.fulfill({
    status: 200, headers: { 'Content-Type': 'text/event-stream' }, body: cannedStream(cannedAnswer) }));
  await page.locator('#input').fill('Show me Markdown');
  await page.locator('#send').click();
  const a = await waitAnswer(page, 0);
  await page.unroute('**/v1/chat/completions');
  const c = page.locator('#messages .msg.assistant .content');
  assert.equal(await c.locator('script, img, [onerror]').count(), 0, 'no element from the answer\'s HTML');
  assert.equal(await page.evaluate(() => window.__pwned), undefined, 'nothing ran');
  assert.ok(a.text.includes('<script>window.__pwned = 1</script>'), 'the script tag shows as text');
  assert.ok(a.text.includes('<img src=x onerror="window.__pwned = 2">'), 'the img tag shows as text');
  assert.equal(await c.locator('a[href^="javascript"]').count(), 0, 'no javascript: link');
  if (!markedEmbedded) {
    assert.ok(a.text.includes('# Shopping list'), 'plain text without marked');
    return;
  }
  assert.equal(await c.locator('h1').textContent(), 'Shopping list');
  assert.equal(await c.locator('strong').textContent(), 'bold');
  assert.equal(await c.locator('ul > li').count(), 2);
  assert.equal(await c.locator('pre > code.language-js').textContent(), "const tag = '<b>not bold</b>';\n");
  assert.equal(await c.locator('pre b').count(), 0);
  assert.equal(await c.locator('table td').count(), 2);
  const good = c.locator('a[href="https://example.com/"]');
  assert.equal(await good.getAttribute('target'), '_blank');
  assert.equal(await good.getAttribute('rel'), 'noopener noreferrer');
  assert.ok(!(await c.innerHTML()).includes('javascript:'), 'the bad link lost its href');
  // The long code block: split across segments that join seamlessly, every line kept once.
  const parts = await c.locator('pre > code.language-python').allTextContents();
  assert.ok(parts.length >= 2, `in ${parts.length} segments`);
  assert.equal(parts.join(''), longCode.join('\n') + '\n');
  assert.equal(await c.locator('.seg.split + .seg.cont').count(), parts.length - 1);
  assert.equal(await c.locator('p').last().textContent(), 'The end.');
});

await step('streamed piece by piece, an answer renders exactly as at once', async () => {
  // markdown.js's segments depend only on complete lines: rendering after every few characters
  // must end in the same DOM as rendering the whole text once.
  const samples = [
    cannedAnswer,
    count(130),
    ['Intro', '', '1. one', '2. two', '   - nested', '   - more', '3. three', '', '~~~', 'tilde', '~~~',
     'Title', '=====', '', '> quote', '> more', '', 'end'].join('\n'),
    ['```', ...count(95).split('\n'), '```', 'after the fence', '', '    indented code', '',
     '| h |', '|---|', ...Array.from({ length: 50 }, (_, i) => `| ${i} |`)].join('\n'),
  ];
  const results = await page.evaluate(async (texts) => {
    const { MarkdownStream } = await import('/markdown.js');
    return texts.map((text) => {
      const once = document.createElement('div');
      const whole = new MarkdownStream(once);
      whole.append(text);
      whole.flush(true);
      const streamed = document.createElement('div');
      const pieces = new MarkdownStream(streamed);
      for (let i = 0, n = 1; i < text.length; i += n, n = 1 + (i % 7)) {
        pieces.append(text.slice(i, i + n));
        pieces.flush();
      }
      pieces.flush(true);
      return { same: once.innerHTML === streamed.innerHTML, segments: once.childElementCount,
               leftovers: streamed.querySelectorAll('.seg.tail, .seg:empty').length };
    });
  }, samples);
  for (const [i, r] of results.entries()) {
    assert.ok(r.same, `sample ${i}: streamed and whole differ`);
    assert.ok(r.segments >= 2, `sample ${i}: ${r.segments} segments`);
    assert.equal(r.leftovers, 0, `sample ${i}: an unfinished or empty segment is left`);
  }
});

await step('without marked.min.js the answers show as plain text', async () => {
  await page.route('**/marked.min.js', (route) => route.fulfill({ status: 404, body: '' }));
  await page.reload();
  const c = page.locator('#messages .msg.assistant .content');
  await c.locator('.plain').first().waitFor();
  assert.equal(await c.locator('h1, script, img').count(), 0);
  const text = await c.innerText();
  assert.ok(text.includes('# Shopping list') && text.includes('<script>window.__pwned = 1</script>'), text);
  assert.equal(await page.evaluate(() => window.__pwned), undefined, 'nothing ran');
  await page.unroute('**/marked.min.js');
});

await step('reload keeps the chats: the list, switching, copy, export as JSON and Markdown', async () => {
  await page.reload();
  await page.locator('#messages .msg.assistant.done').first().waitFor();
  assert.equal(await page.locator('#messages .msg').count(), 2, 'the Markdown chat is shown again');
  assert.equal(await page.locator('#messages .msg.user .content').textContent(), 'Show me Markdown');
  if (markedEmbedded) assert.equal(await page.locator('#messages .content h1').count(), 1);
  const titles = await page.locator('#chat-list .chat-item-title').allTextContents();
  assert.deepEqual(titles, ['Show me Markdown', countPrompt(3000), countPrompt(12)], 'newest first');
  assert.equal(await page.locator('#chat-list .chat-item.active .chat-item-title').textContent(), 'Show me Markdown');
  // The first chat: its two answers, as they were.
  await page.locator('#chat-list .chat-item').nth(2).click();
  assert.equal(await page.locator('#messages .msg').count(), 4);
  const first = await waitAnswer(page, 0);
  assert.equal(first.text.trim(), count(12));
  assert.match(first.meta, /^\d+ tokens/);
  assert.match((await waitAnswer(page, 1)).meta, /stopped/);
  // Copy puts a message's text on the clipboard.
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: server.base });
  await page.locator('#messages .msg.assistant .copy').first().click();
  await page.locator('#messages .msg.assistant .copy', { hasText: 'Copied' }).waitFor();
  assert.equal((await page.evaluate(() => navigator.clipboard.readText())).trim(), count(12));
  const [json] = await Promise.all([page.waitForEvent('download'), page.locator('#export-json').click()]);
  assert.match(json.suggestedFilename(), /^lamina-chat-\d{8}-\d{4}\.json$/);
  const doc = JSON.parse(fs.readFileSync(await json.path(), 'utf8'));
  assert.equal(doc.messages.length, 4);
  assert.deepEqual(doc.messages[0], { role: 'user', content: countPrompt(12) });
  assert.equal(doc.messages[1].content.trim(), count(12));
  const [md] = await Promise.all([page.waitForEvent('download'), page.locator('#export-md').click()]);
  const markdown = fs.readFileSync(await md.path(), 'utf8');
  assert.ok(markdown.startsWith(`# ${countPrompt(12)}\n\n## You\n\n${countPrompt(12)}\n\n## lamina\n\n1\n2\n`), markdown.slice(0, 120));
});

await step('dark mode: the system\'s choice, and the toggle', async () => {
  const bg = () => page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  const light = await bg();
  await page.emulateMedia({ colorScheme: 'dark' });
  const dark = await bg();
  assert.notEqual(dark, light, 'follows prefers-color-scheme');
  await page.locator('#theme-toggle').click();  // auto → dark
  assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark');
  await page.locator('#theme-toggle').click();  // dark → light, though the system is dark
  assert.equal(await bg(), light);
  await page.reload();
  assert.equal(await bg(), light, 'the choice is kept');
  await page.locator('#theme-toggle').click();  // light → auto
  assert.equal(await bg(), dark);
  await page.emulateMedia({ colorScheme: 'light' });
});

await step('New chat clears the thread', async () => {
  await page.locator('#new-chat').click();
  assert.equal(await page.locator('#messages .msg').count(), 0);
  // A fresh conversation answers from its own first turn.
  await page.locator('#input').fill(countPrompt(4));
  await page.locator('#send').click();
  const a = await waitAnswer(page, 0);
  assert.equal(a.text.trim(), count(4));
});

await step('the monitor tab shows the slots, KV, props and the recent requests', async () => {
  await page.locator('#tab-monitor').click();
  await page.locator('#panel-monitor').waitFor({ state: 'visible' });
  await page.locator('#recent tr:not(.empty-row)').first().waitFor();
  await page.locator('#slots tr').nth(1).waitFor();
  assert.equal(await page.locator('#slots tr').count(), 2, 'one row per slot (-np 2)');
  assert.ok((await page.locator('#slots .bar').count()) === 2, 'a fill bar per slot');
  const recent = await page.locator('#recent tr').allTextContents();
  // The two answers that finished (a stream cancelled by its client is not listed).
  assert.ok(recent.length >= 2, `the finished chat requests: ${recent.length}`);
  assert.match(recent[0], /\/v1\/chat\/completions/);
  assert.match(recent[0], /200/);
  await page.locator('#props-slots', { hasText: '2' }).waitFor();
  await page.locator('#props-nctx', { hasText: '6144' }).waitFor();
  assert.match(await page.locator('#mon-kv').textContent(), /\S/);
  assert.match(await page.locator('#mon-kv-bytes').textContent(), /used of \d/);
  assert.match(await page.locator('#mon-model').textContent(), /\S/);
  // Polling goes on: the "updated" stamp changes within two seconds.
  const before = await page.locator('#mon-updated').textContent();
  await page.waitForFunction((b) => document.getElementById('mon-updated').textContent !== b, before,
                             { timeout: 3000 });
  await page.locator('#tab-chat').click();
  await page.locator('#input').waitFor({ state: 'visible' });
});

await step('with --api-key: a 401 until the key is entered in the settings', async () => {
  const key = 'sk-lamina-web';
  const keyed = await startServer(['--api-key', key]);
  // The page's files are public, as "/" is; the API is not.
  for (const file of ['/', '/app.js', '/markdown.js', '/style.css']) {
    assert.equal((await fetch(`${keyed.base}${file}`)).status, 200, file);
  }
  assert.equal((await fetch(`${keyed.base}/props`)).status, 401);
  await page.goto(`${keyed.base}/`);  // a new origin: nothing stored yet
  await page.locator('#temperature').fill('0');
  await page.locator('#input').fill(countPrompt(3));
  await page.locator('#send').click();
  const bad = await waitAnswer(page, 0);
  assert.match(bad.error ?? '', /401.*Invalid API Key/, `the error line: ${bad.error}`);
  assert.equal(await page.locator('#messages .msg.user.failed').count(), 1, 'the refused turn is marked');
  await page.locator('#api-key').fill(key);
  await page.locator('#api-key').dispatchEvent('change');
  await page.locator('#input').fill(countPrompt(3));
  await page.locator('#input').press('Enter');
  const good = await waitAnswer(page, 1);
  assert.equal(good.error, null, `no error line: ${good.error}`);
  assert.equal(good.text.trim(), count(3));
  // The key is kept in this browser's localStorage.
  assert.equal(await page.evaluate(() => localStorage.getItem('lamina.apiKey')), key);
});

await step('a thinking model: reasoning in a collapsed "Thinking" block above the answer', async () => {
  // ChatML whose generation prompt opens a <think> block (as Qwen3's); the budget of 6 tokens
  // ends it, then the answer follows (tests/server_reasoning_test.mjs checks the server's side).
  const template = `{%- for message in messages -%}
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif -%}`;
  const templateFile = path.join(profileDir, 'think.jinja');
  fs.writeFileSync(templateFile, template);
  thinker = await startServer(['--chat-template-file', templateFile, '--reasoning-budget', '6']);
  await page.goto(`${thinker.base}/`);
  await page.locator('#temperature').fill('0');
  await page.locator('#max_tokens').fill('40');
  await page.locator('#input').fill(countPrompt(5));
  await page.locator('#send').click();
  const a = await waitAnswer(page, 0);
  assert.equal(a.error, null);
  const thinking = page.locator('#messages .msg.assistant .thinking');
  assert.ok(await thinking.isVisible(), 'the Thinking block is shown');
  assert.equal(await thinking.evaluate((d) => d.open), false, 'collapsed');
  assert.match(await thinking.locator('summary').textContent(), /^Thought for \d+\.\d s$/);
  const reasoning = (await thinking.locator('.reasoning').textContent()).trim();
  assert.ok(reasoning.length > 0, 'the reasoning is in the block');
  assert.ok(a.text.trim().length > 0 && !a.text.includes(reasoning), `the answer apart: ${a.text}`);
  await thinking.locator('summary').click();
  assert.equal(await thinking.evaluate((d) => d.open), true, 'opens on a click');
  assert.ok(await thinking.locator('.reasoning').isVisible());
});

await step('the status dot turns red when the server dies', async () => {
  await page.locator('#health-dot.up').waitFor();
  thinker.proc.kill('SIGKILL');
  servers.delete(thinker);
  const t1 = Date.now();
  await page.locator('#health-dot.down').waitFor({ timeout: 6000 });
  console.log(`     red ${Date.now() - t1} ms after the kill`);
  assert.match(await page.locator('#health-dot').getAttribute('title'), /unreachable/);
});

await step('the page loaded nothing external and threw nothing', async () => {
  assert.deepEqual(pageErrors, []);
});

await step('with the browser closed, SIGTERM stops both servers (exit code 0)', async () => {
  // The browser goes first: an idle keep-alive connection holds a server's exit for up to the
  // 5 s keep-alive timeout (stopServer allows 10 s).
  await context.close();
  context = null;
  for (const s of [...servers]) {
    const t1 = Date.now();
    await stopServer(s);
    console.log(`     ${s.base} stopped in ${Date.now() - t1} ms`);
  }
});

clearTimeout(watchdog);
console.log(`web_ui: ${passed} passed, 0 failed (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
