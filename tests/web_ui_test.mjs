// Drives the web page of a real `lamina serve` (the shipped model, a free loopback port) in real
// headless Chromium through the npm package playwright-core (tests/node): the chat streams a
// greedy count from 1 to 12 with temperature 0 set in the settings, Stop aborts a long answer,
// New chat clears the thread, the monitor tab shows the slots and the recent requests, and with
// --api-key the page shows the 401 until the key is entered in its settings.
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
  console.log(`FAIL: the test ran past 55 s${current ? ` (in: ${current})` : ''}`);
  for (const s of servers) console.log(`server log:\n${s.log()}`);
  process.exit(1);
}, 55_000);

const startServer = (extra = []) =>
  startLamina(binary, ['-m', model, '-np', '2', '-c', '2048', ...extra], servers);
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
    text: await m.locator('.content').textContent(),
    meta: await m.locator('.meta').textContent(),
    error: (await m.locator('.error').count()) ? await m.locator('.error').textContent() : null,
  };
}

let server;
let page;
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
    if (!url.startsWith('data:') && ![...servers].some((s) => url.startsWith(`${s.base}/`))) {
      pageErrors.push(`external request ${url}`);
    }
  });
  const res = await page.goto(`${server.base}/`);
  assert.equal(res.status(), 200);
  assert.equal(await page.title(), 'lamina');
  for (const id of ['#input', '#send', '#messages', '#tab-chat', '#tab-monitor', '#temperature', '#new-chat']) {
    assert.equal(await page.locator(id).count(), 1, `${id} is on the page`);
  }
  // /props fills the header's model name.
  await page.locator('#model-name', { hasText: /\S/ }).waitFor();
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

await step('Stop aborts a long answer and the page takes the next one', async () => {
  // The tiny model counts at thousands of tokens per second: the click on Stop comes from inside
  // the page, as soon as the streamed text holds "3", so the answer cannot finish first.
  await page.evaluate(() => {
    const thread = document.getElementById('messages');
    const watch = new MutationObserver(() => {
      const c = thread.querySelectorAll('.msg.assistant .content')[1];
      if (c && c.textContent.includes('3')) {
        watch.disconnect();
        document.getElementById('stop').click();
      }
    });
    watch.observe(thread, { childList: true, subtree: true, characterData: true });
  });
  await page.locator('#input').fill(countPrompt(1000));
  await page.locator('#input').press('Enter');
  const a = await waitAnswer(page, 1, 5000);
  assert.match(a.meta, /stopped/, `the stats line says stopped: ${a.meta}`);
  assert.equal(a.error, null);
  assert.ok(a.text.startsWith('1\n2\n3'), `a partial count: ${a.text.slice(0, 40)}`);
  assert.ok(!a.text.includes('\n1000'), 'the count did not finish');
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
  await page.locator('#props-nctx', { hasText: '1024' }).waitFor();
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
