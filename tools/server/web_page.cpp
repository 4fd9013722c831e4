// The web chat and monitor page served at "/" (one self-contained page: no build step, no CDN).
//
// Chat: POST /v1/chat/completions with stream: true, read as server-sent events; Stop aborts the
// fetch (the server cancels the request when its stream write fails). Monitor: GET /monitor
// every second while the tab is shown, GET /props when it opens. Model output only ever reaches
// the page through textContent. Stable ids for tests/web_ui_test.mjs: #input, #send, #stop,
// #new-chat, #messages (.msg.user / .msg.assistant, .done when finished, .content, .meta),
// #temperature #top_k #top_p #min_p #max_tokens #seed #system #api-key, #tab-chat, #tab-monitor,
// #slots and #recent (table bodies), #mon-model, #mon-kv, #mon-tps, #props-slots, #props-nctx.
#include "server.h"

namespace lamina::cli {

const std::string& WebPage() {
  static const std::string kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>lamina</title>
<link rel="icon" href="data:,">
<style>
:root {
  --bg: #f6f7f9; --panel: #ffffff; --line: #e3e6eb; --text: #1d2330; --muted: #667085;
  --accent: #2f6fde; --accent-soft: #e8f0fd; --user: #2f6fde; --danger: #c8322b;
  --danger-soft: #fdecea; --ok: #1f8a4c; --ok-soft: #e6f5ec; --radius: 10px;
  --mono: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
}
* { box-sizing: border-box; }
html, body { height: 100%; margin: 0; }
body {
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  color: var(--text); background: var(--bg); display: flex; flex-direction: column;
}
button, input, textarea, select { font: inherit; color: inherit; }
header {
  display: flex; align-items: center; gap: 16px; padding: 0 20px; height: 54px; flex: none;
  background: var(--panel); border-bottom: 1px solid var(--line);
}
.brand { font-weight: 700; font-size: 18px; letter-spacing: .2px; display: flex; align-items: center; gap: 8px; }
.brand .dot { width: 10px; height: 10px; border-radius: 50%; background: var(--muted); }
.brand .dot.up { background: var(--ok); }
.brand .dot.down { background: var(--danger); }
#model-name { color: var(--muted); font-size: 13px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; min-width: 0; }
nav { margin-left: auto; display: flex; gap: 4px; flex: none; }
nav button {
  border: 0; background: transparent; padding: 7px 14px; border-radius: 8px; cursor: pointer;
  color: var(--muted); font-weight: 600;
}
nav button:hover { background: var(--bg); color: var(--text); }
nav button[aria-selected="true"] { background: var(--accent-soft); color: var(--accent); }
main { flex: 1; min-height: 0; display: flex; }
.panel[hidden] { display: none !important; }
/* Chat */
#panel-chat { flex: 1; min-height: 0; display: flex; }
.chat-col { flex: 1; min-width: 0; display: flex; flex-direction: column; }
#messages { flex: 1; min-height: 0; overflow-y: auto; padding: 24px 20px 8px; }
.thread { max-width: 820px; margin: 0 auto; display: flex; flex-direction: column; gap: 14px; }
.msg { display: flex; flex-direction: column; max-width: 88%; }
.msg.user { align-self: flex-end; align-items: flex-end; }
.msg.assistant { align-self: flex-start; }
.msg .role { font-size: 12px; color: var(--muted); margin: 0 4px 3px; font-weight: 600; }
.msg .content {
  white-space: pre-wrap; overflow-wrap: anywhere; padding: 10px 14px; border-radius: var(--radius);
  background: var(--panel); border: 1px solid var(--line); min-height: 1.5em;
}
.msg.user .content { background: var(--user); color: #fff; border-color: var(--user); }
.msg.assistant.streaming .content::after {
  content: ""; display: inline-block; width: 7px; height: 1.05em; margin-left: 2px;
  vertical-align: text-bottom; background: var(--accent); animation: blink 1s steps(2) infinite;
}
@keyframes blink { 50% { opacity: 0; } }
.msg.failed .content { opacity: .55; }
.msg .meta { font-size: 12px; color: var(--muted); margin: 4px 4px 0; font-variant-numeric: tabular-nums; }
.msg .meta:empty { display: none; }
.msg .error {
  margin-top: 6px; padding: 8px 12px; border-radius: 8px; background: var(--danger-soft);
  color: var(--danger); font-size: 13px; white-space: pre-wrap;
}
.empty { text-align: center; color: var(--muted); margin-top: 12vh; }
.empty h2 { color: var(--text); font-size: 22px; margin: 0 0 6px; }
.examples { display: flex; flex-wrap: wrap; gap: 8px; justify-content: center; margin-top: 16px; }
.examples button {
  border: 1px solid var(--line); background: var(--panel); border-radius: 999px; padding: 6px 14px;
  cursor: pointer; font-size: 13px;
}
.examples button:hover { border-color: var(--accent); color: var(--accent); }
.composer { flex: none; padding: 12px 20px 18px; }
.composer-box {
  max-width: 820px; margin: 0 auto; display: flex; gap: 8px; align-items: flex-end;
  background: var(--panel); border: 1px solid var(--line); border-radius: 12px; padding: 8px;
  box-shadow: 0 1px 3px rgba(16, 24, 40, .05);
}
.composer-box:focus-within { border-color: var(--accent); }
#input {
  flex: 1; border: 0; outline: 0; resize: none; min-height: 40px; max-height: 200px;
  padding: 8px 6px; background: transparent;
}
.btn {
  border: 1px solid var(--line); background: var(--panel); border-radius: 8px; padding: 8px 14px;
  cursor: pointer; font-weight: 600; white-space: nowrap;
}
.btn:hover:not(:disabled) { border-color: var(--accent); color: var(--accent); }
.btn:disabled { opacity: .5; cursor: default; }
.btn.primary { background: var(--accent); border-color: var(--accent); color: #fff; }
.btn.primary:hover:not(:disabled) { color: #fff; filter: brightness(1.08); }
.btn.danger { background: var(--danger-soft); border-color: var(--danger-soft); color: var(--danger); }
.btn[hidden] { display: none; }
.below { max-width: 820px; margin: 6px auto 0; display: flex; align-items: center; gap: 4px; }
.hint { margin-left: auto; font-size: 12px; color: var(--muted); text-align: right; }
.btn.ghost { border-color: transparent; background: transparent; color: var(--muted); font-weight: 600; font-size: 13px; padding: 3px 9px; }
.btn.ghost:hover:not(:disabled) { border-color: var(--line); background: var(--panel); color: var(--accent); }
aside#settings {
  width: 290px; flex: none; border-left: 1px solid var(--line); background: var(--panel);
  overflow-y: auto; padding: 16px;
}
aside h3 { font-size: 13px; text-transform: uppercase; letter-spacing: .6px; color: var(--muted); margin: 0 0 10px; }
.field { display: flex; flex-direction: column; gap: 3px; margin-bottom: 11px; }
.field label { font-size: 13px; font-weight: 600; }
.field input, .field textarea {
  border: 1px solid var(--line); border-radius: 7px; padding: 6px 9px; background: var(--bg);
  width: 100%;
}
.field input:focus, .field textarea:focus { outline: 0; border-color: var(--accent); background: #fff; }
.field textarea { resize: vertical; min-height: 64px; }
.field small, .note { color: var(--muted); font-size: 11.5px; }
.note { margin: -4px 0 10px; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; gap: 0 10px; }
#settings-toggle, #settings-close { display: none; }
.aside-head { display: flex; align-items: baseline; justify-content: space-between; }
/* Monitor */
#panel-monitor { flex: 1; min-height: 0; overflow-y: auto; padding: 20px; }
.mon { max-width: 1100px; margin: 0 auto; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(200px, 1fr)); gap: 12px; margin-bottom: 18px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: var(--radius); padding: 12px 14px; min-width: 0; }
.card .label { font-size: 12px; color: var(--muted); font-weight: 600; text-transform: uppercase; letter-spacing: .5px; }
.card .value { font-size: 20px; font-weight: 650; margin-top: 2px; overflow-wrap: anywhere; font-variant-numeric: tabular-nums; }
.card .value.small { font-size: 16px; line-height: 1.35; margin-top: 5px; }
.card .sub { font-size: 12.5px; color: var(--muted); margin-top: 2px; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
section.block { background: var(--panel); border: 1px solid var(--line); border-radius: var(--radius); margin-bottom: 18px; overflow: hidden; }
section.block h3 { margin: 0; padding: 11px 14px; font-size: 14px; border-bottom: 1px solid var(--line); display: flex; justify-content: space-between; }
section.block h3 span { color: var(--muted); font-weight: 400; font-size: 12.5px; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 13.5px; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: 7px 14px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { font-size: 12px; color: var(--muted); font-weight: 600; background: #fafbfc; }
tbody tr:last-child td { border-bottom: 0; }
td.num, th.num { text-align: right; }
td.none { color: var(--muted); text-align: center; }
.bar { position: relative; height: 8px; border-radius: 4px; background: var(--bg); border: 1px solid var(--line); min-width: 140px; overflow: hidden; }
.bar > i { position: absolute; left: 0; top: 0; bottom: 0; background: var(--accent); border-radius: 4px; }
.fill { display: flex; align-items: center; gap: 10px; }
.fill .bar { flex: 1; }
.fill span { font-size: 12px; color: var(--muted); min-width: 88px; text-align: right; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 999px; font-size: 12px; font-weight: 600; background: var(--bg); color: var(--muted); }
.badge.busy { background: var(--accent-soft); color: var(--accent); }
.badge.ok { background: var(--ok-soft); color: var(--ok); }
.badge.err { background: var(--danger-soft); color: var(--danger); }
#mon-error { margin-bottom: 14px; }
#mon-error:empty { display: none; }
.banner { padding: 9px 13px; border-radius: 8px; background: var(--danger-soft); color: var(--danger); font-size: 13.5px; }
@media (max-width: 860px) {
  aside#settings { position: fixed; right: 0; top: 54px; bottom: 0; z-index: 5; box-shadow: -6px 0 18px rgba(16, 24, 40, .12); }
  aside#settings.closed { display: none; }
  #settings-toggle, #settings-close { display: inline-block; }
  header { padding: 0 12px; gap: 10px; }
  #messages { padding: 16px 12px 8px; }
  .composer { padding: 10px 12px 14px; }
  .msg { max-width: 96%; }
}
@media (max-width: 520px) {
  .hint { display: none; }
}
</style>
</head>
<body>
<header>
  <div class="brand"><span class="dot" id="health-dot" title="server status"></span>lamina</div>
  <div id="model-name"></div>
  <nav role="tablist">
    <button id="tab-chat" role="tab" aria-selected="true" aria-controls="panel-chat">Chat</button>
    <button id="tab-monitor" role="tab" aria-selected="false" aria-controls="panel-monitor">Monitor</button>
  </nav>
</header>
<main>
  <div id="panel-chat" class="panel" role="tabpanel">
    <div class="chat-col">
      <div id="messages" aria-live="polite"><div class="thread" id="thread"></div></div>
      <div class="composer">
        <div class="composer-box">
          <textarea id="input" rows="1" placeholder="Message lamina…" autocomplete="off"></textarea>
          <button id="stop" class="btn danger" hidden>Stop</button>
          <button id="send" class="btn primary">Send</button>
        </div>
        <div class="below">
          <button id="new-chat" class="btn ghost">New chat</button>
          <button id="settings-toggle" class="btn ghost">Settings</button>
          <span class="hint">Enter sends · Shift+Enter for a new line</span>
        </div>
      </div>
    </div>
    <aside id="settings">
      <div class="aside-head"><h3>Sampling</h3><button id="settings-close" class="btn ghost">Close</button></div>
      <div class="note">Empty fields use the server's defaults (shown greyed).</div>
      <div class="grid2">
        <div class="field"><label for="temperature">temperature</label><input id="temperature" type="number" step="0.05" min="0"></div>
        <div class="field"><label for="top_k">top_k</label><input id="top_k" type="number" step="1" min="0"></div>
        <div class="field"><label for="top_p">top_p</label><input id="top_p" type="number" step="0.01" min="0" max="1"></div>
        <div class="field"><label for="min_p">min_p</label><input id="min_p" type="number" step="0.01" min="0" max="1"></div>
        <div class="field"><label for="max_tokens">max_tokens</label><input id="max_tokens" type="number" step="1"></div>
        <div class="field"><label for="seed">seed</label><input id="seed" type="number" step="1"></div>
      </div>
      <div class="field"><label for="system">System prompt</label><textarea id="system" placeholder="(none)"></textarea></div>
      <h3>Connection</h3>
      <form id="conn" autocomplete="off"><div class="field"><label for="api-key">API key</label><input id="api-key" type="password" autocomplete="off" placeholder="(none)"><small>Sent as Authorization: Bearer …; kept in this browser.</small></div></form>
      <button id="reset-settings" class="btn">Reset settings</button>
    </aside>
  </div>
  <div id="panel-monitor" class="panel" role="tabpanel" hidden>
    <div class="mon">
      <div id="mon-error"></div>
      <div class="cards">
        <div class="card"><div class="label">Model</div><div class="value small" id="mon-model">–</div><div class="sub" id="mon-path"></div></div>
        <div class="card"><div class="label">Server</div><div class="value"><span id="props-slots">–</span> slots</div><div class="sub">n_ctx per slot: <span id="props-nctx">–</span></div></div>
        <div class="card"><div class="label">KV cache</div><div class="value" id="mon-kv">–</div><div class="sub" id="mon-kv-bytes"></div><div class="bar" style="margin-top:6px"><i id="mon-kv-bar" style="width:0"></i></div></div>
        <div class="card"><div class="label">Throughput</div><div class="value"><span id="mon-tps">–</span> tok/s</div><div class="sub" id="mon-pps"></div></div>
        <div class="card"><div class="label">Totals</div><div class="value" id="mon-total">–</div><div class="sub" id="mon-queued"></div></div>
      </div>
      <section class="block">
        <h3>Slots <span id="mon-updated"></span></h3>
        <div class="table-wrap"><table>
          <thead><tr><th class="num">slot</th><th>state</th><th style="width:45%">context fill (n_past / n_ctx)</th><th class="num">prompt</th><th class="num">decoded</th></tr></thead>
          <tbody id="slots"></tbody>
        </table></div>
      </section>
      <section class="block">
        <h3>Recent requests <span>newest first, at most 32</span></h3>
        <div class="table-wrap"><table>
          <thead><tr><th>finished</th><th>route</th><th>status</th><th class="num">slot</th><th class="num">prompt</th><th class="num">cached</th><th class="num">predicted</th><th class="num">tok/s</th><th>stop</th></tr></thead>
          <tbody id="recent"></tbody>
        </table></div>
      </section>
    </div>
  </div>
</main>
<script>
(() => {
  'use strict';
  const $ = (id) => document.getElementById(id);
  const SETTINGS = ['temperature', 'top_k', 'top_p', 'min_p', 'max_tokens', 'seed'];
  const INTS = new Set(['top_k', 'max_tokens', 'seed']);
  const store = {
    get(k, d) { try { const v = localStorage.getItem(k); return v === null ? d : v; } catch { return d; } },
    set(k, v) { try { localStorage.setItem(k, v); } catch { /* private mode */ } },
  };

  // ---- helpers ----
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function headers(json) {
    const h = {};
    if (json) h['Content-Type'] = 'application/json';
    const key = $('api-key').value.trim();
    if (key) h['Authorization'] = 'Bearer ' + key;
    return h;
  }
  function fmtBytes(n) {
    if (typeof n !== 'number' || !isFinite(n)) return '–';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; ++i; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + ' ' + u[i];
  }
  function fmtNum(n, digits) {
    if (typeof n !== 'number' || !isFinite(n)) return '–';
    return n.toLocaleString(undefined, { maximumFractionDigits: digits ?? 0, minimumFractionDigits: digits ?? 0 });
  }
  async function errorText(res) {
    let msg = 'HTTP ' + res.status;
    try {
      const j = await res.json();
      if (j && j.error) msg += ': ' + (j.error.message || JSON.stringify(j.error));
    } catch { /* not JSON */ }
    if (res.status === 401) msg += ' (set the API key in the settings)';
    return msg;
  }

  // ---- settings ----
  function loadSettings() {
    let saved = {};
    try { saved = JSON.parse(store.get('lamina.settings', '{}')) || {}; } catch { saved = {}; }
    for (const k of SETTINGS) $(k).value = saved[k] ?? '';
    $('system').value = saved.system ?? '';
    $('api-key').value = store.get('lamina.apiKey', '');
  }
  function saveSettings() {
    const s = { system: $('system').value };
    for (const k of SETTINGS) s[k] = $(k).value;
    store.set('lamina.settings', JSON.stringify(s));
    store.set('lamina.apiKey', $('api-key').value.trim());
  }
  for (const id of [...SETTINGS, 'system', 'api-key']) $(id).addEventListener('change', saveSettings);
  $('conn').addEventListener('submit', (e) => { e.preventDefault(); saveSettings(); });
  $('reset-settings').addEventListener('click', () => {
    for (const k of SETTINGS) $(k).value = '';
    $('system').value = '';
    saveSettings();
  });
  function samplingFields() {
    const out = {};
    for (const k of SETTINGS) {
      const raw = $(k).value.trim();
      if (raw === '') continue;
      const v = INTS.has(k) ? parseInt(raw, 10) : parseFloat(raw);
      if (Number.isFinite(v)) out[k] = v;
    }
    return out;
  }

  // ---- server basics (/props) ----
  let props = null;
  async function loadProps() {
    try {
      const res = await fetch('/props', { headers: headers(false) });
      if (!res.ok) throw new Error(await errorText(res));
      props = await res.json();
      $('health-dot').className = 'dot up';
      $('model-name').textContent = props.model_alias || '';
      $('props-slots').textContent = props.total_slots ?? '–';
      const g = props.default_generation_settings || {};
      $('props-nctx').textContent = g.n_ctx ?? '–';
      $('mon-path').textContent = props.model_path || '';
      const p = g.params || {};
      const defaults = { temperature: p.temperature, top_k: p.top_k, top_p: p.top_p, min_p: p.min_p,
                         max_tokens: p.n_predict, seed: p.seed === 4294967295 ? -1 : p.seed };
      for (const k of SETTINGS) {
        if (defaults[k] !== undefined && defaults[k] !== null) {
          const v = typeof defaults[k] === 'number' && !INTS.has(k) ? +defaults[k].toFixed(4) : defaults[k];
          $(k).placeholder = String(v);
        }
      }
      return true;
    } catch (e) {
      $('health-dot').className = 'dot down';
      $('health-dot').title = String(e.message || e);
      return false;
    }
  }

  // ---- chat ----
  const history = [];     // {role, content} of finished turns
  let controller = null;  // the AbortController of the answer being generated
  const thread = $('thread');
  const scroller = $('messages');

  function nearBottom() { return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 80; }
  function toBottom() { scroller.scrollTop = scroller.scrollHeight; }

  function showEmpty() {
    thread.replaceChildren();
    const box = el('div', 'empty');
    box.append(el('h2', null, 'Chat with lamina'));
    box.append(el('div', null, 'Answers stream as they are generated. Sampling settings are on the right.'));
    const ex = el('div', 'examples');
    for (const t of ['Count from 1 to 20, one number per line.', 'Count from 1 to 100, one number per line.']) {
      const b = el('button', null, t);
      b.addEventListener('click', () => { $('input').value = t; autosize(); $('input').focus(); });
      ex.append(b);
    }
    box.append(ex);
    box.id = 'empty';
    thread.append(box);
  }
  function addMessage(role, text) {
    const empty = $('empty');
    if (empty) empty.remove();
    const m = el('div', 'msg ' + role);
    m.append(el('div', 'role', role === 'user' ? 'You' : 'lamina'));
    const c = el('div', 'content', text);
    m.append(c);
    m.append(el('div', 'meta'));
    thread.append(m);
    toBottom();
    return m;
  }
  function setBusy(busy) {
    $('send').disabled = busy;
    $('send').hidden = busy;
    $('stop').hidden = !busy;
    $('panel-chat').dataset.busy = busy ? '1' : '0';
  }
  function autosize() {
    const t = $('input');
    t.style.height = 'auto';
    t.style.height = Math.min(t.scrollHeight, 200) + 'px';
  }

  async function send() {
    const text = $('input').value;
    if (controller || text.trim() === '') return;
    $('input').value = '';
    autosize();
    saveSettings();
    const u = addMessage('user', text);
    history.push({ role: 'user', content: text });
    const messages = [];
    const system = $('system').value.trim();
    if (system) messages.push({ role: 'system', content: system });
    messages.push(...history);
    const body = Object.assign({ messages, stream: true }, samplingFields());

    const m = addMessage('assistant', '');
    m.classList.add('streaming');
    const content = m.querySelector('.content');
    const meta = m.querySelector('.meta');
    let answer = '';
    let final = null;     // the chunk with finish_reason
    let error = null;
    let stopped = false;
    const t0 = performance.now();
    let firstAt = 0, pieces = 0;
    controller = new AbortController();
    setBusy(true);
    try {
      const res = await fetch('/v1/chat/completions', {
        method: 'POST', headers: headers(true), body: JSON.stringify(body), signal: controller.signal,
      });
      if (!res.ok) throw new Error(await errorText(res));
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = '';
      let done = false;
      const handle = (line) => {
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (!line.startsWith('data:')) return;
        const data = line.slice(5).trimStart();
        if (data === '[DONE]') { done = true; return; }
        let j;
        try { j = JSON.parse(data); } catch { return; }
        if (j.error) {
          error = j.error.message || JSON.stringify(j.error);
          return;
        }
        const choice = (j.choices || [])[0];
        if (choice) {
          const piece = choice.delta && choice.delta.content;
          if (typeof piece === 'string' && piece !== '') {
            const stick = nearBottom();
            if (!firstAt) firstAt = performance.now();
            ++pieces;
            answer += piece;
            content.textContent = answer;
            if (stick) toBottom();
          }
          if (choice.finish_reason) final = j;
        }
        if (j.timings && !final) final = j;
      };
      while (!done) {
        const { value, done: end } = await reader.read();
        if (end) break;
        buf += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          handle(buf.slice(0, nl));
          buf = buf.slice(nl + 1);
          if (done) break;
        }
      }
      buf += decoder.decode();
      if (!done && buf) handle(buf);
      if (done) reader.cancel().catch(() => {});
    } catch (e) {
      if (e && e.name === 'AbortError') stopped = true;
      else error = String((e && e.message) || e);
    } finally {
      controller = null;
      setBusy(false);
    }
    m.classList.remove('streaming');
    content.textContent = answer;
    if (answer !== '') {
      history.push({ role: 'assistant', content: answer });
    } else {
      // Nothing came back: the turn is left out of the conversation the model sees next.
      history.pop();
      u.classList.add('failed');
      m.classList.add('failed');
    }
    const parts = [];
    const t = final && final.timings;
    if (t && typeof t.predicted_n === 'number') {
      parts.push(t.predicted_n + ' tokens');
      if (typeof t.predicted_per_second === 'number') parts.push(t.predicted_per_second.toFixed(1) + ' tok/s');
      if (typeof t.prompt_n === 'number') {
        parts.push('prompt ' + t.prompt_n + (t.cache_n ? ' + ' + t.cache_n + ' cached' : '') + ' tokens');
      }
    } else if (pieces > 0) {
      const secs = (performance.now() - (firstAt || t0)) / 1000;
      parts.push(pieces + ' chunks' + (secs > 0 ? ' · ' + (pieces / secs).toFixed(1) + ' chunks/s' : ''));
    }
    const reason = final && final.choices && final.choices[0] && final.choices[0].finish_reason;
    if (reason && reason !== 'stop') parts.push('finish: ' + reason);
    if (stopped) parts.push('stopped');
    meta.textContent = parts.join(' · ');
    if (error) m.append(el('div', 'error', error));
    m.classList.add('done');
    toBottom();
    $('input').focus();
  }

  function stop() { if (controller) controller.abort(); }
  function newChat() {
    stop();
    history.length = 0;
    showEmpty();
    $('input').focus();
  }
  $('send').addEventListener('click', send);
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', newChat);
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $('input').addEventListener('input', autosize);
  $('settings-toggle').addEventListener('click', () => $('settings').classList.toggle('closed'));
  $('settings-close').addEventListener('click', () => $('settings').classList.add('closed'));
  if (window.matchMedia('(max-width: 860px)').matches) $('settings').classList.add('closed');

  // ---- monitor ----
  let pollTimer = null;
  let pollGen = 0;  // bumped whenever polling restarts or stops, so one loop runs at a time
  function cell(tr, text, cls) { const td = el('td', cls, text); tr.append(td); return td; }
  function fillBar(used, total) {
    const wrap = el('div', 'fill');
    const bar = el('div', 'bar');
    const i = el('i');
    const frac = total > 0 ? Math.min(1, Math.max(0, used / total)) : 0;
    i.style.width = (frac * 100).toFixed(1) + '%';
    bar.append(i);
    wrap.append(bar, el('span', null, fmtNum(used) + ' / ' + fmtNum(total)));
    return wrap;
  }
  function renderMonitor(m) {
    $('mon-model').textContent = m.model ?? '–';
    const kv = m.kv || {};
    $('mon-kv').textContent = (kv.type ?? '–') + (typeof kv.bits_per_element === 'number' ? ' · ' + +kv.bits_per_element.toFixed(2) + ' bits' : '');
    $('mon-kv-bytes').textContent = fmtBytes(kv.bytes_used) + ' used of ' + fmtBytes(kv.bytes_total);
    $('mon-kv-bar').style.width = (kv.bytes_total > 0 ? Math.min(100, 100 * kv.bytes_used / kv.bytes_total) : 0).toFixed(1) + '%';
    $('mon-tps').textContent = fmtNum(m.predicted_per_second, 1);
    $('mon-pps').textContent = 'generation; prompt ' + fmtNum(m.prompt_per_second, 1) + ' tok/s';
    $('mon-total').textContent = fmtNum(m.tokens_predicted_total) + ' generated';
    $('mon-queued').textContent = fmtNum(m.prompt_tokens_total) + ' prompt tokens · ' + fmtNum(m.queued) + ' queued';

    const slots = $('slots');
    const rows = [];
    for (const s of m.slots || []) {
      const tr = el('tr');
      cell(tr, s.id, 'num');
      const st = el('td');
      st.append(el('span', 'badge' + (s.busy ? ' busy' : ''), s.busy ? 'busy' : 'idle'));
      tr.append(st);
      const f = el('td');
      f.append(fillBar(s.n_past, s.n_ctx));
      tr.append(f);
      cell(tr, fmtNum(s.n_prompt), 'num');
      cell(tr, fmtNum(s.n_decoded), 'num');
      rows.push(tr);
    }
    if (!rows.length) { const tr = el('tr'); cell(tr, 'no slots', 'none').colSpan = 5; rows.push(tr); }
    slots.replaceChildren(...rows);

    const recent = $('recent');
    const rr = [];
    for (const r of m.recent || []) {
      const tr = el('tr');
      const when = typeof r.finished_at === 'number' ? new Date(r.finished_at * 1000).toLocaleTimeString() : '–';
      cell(tr, when);
      cell(tr, r.route);
      const st = el('td');
      st.append(el('span', 'badge ' + (r.status === 200 ? 'ok' : 'err'), r.status));
      tr.append(st);
      cell(tr, r.slot, 'num');
      cell(tr, fmtNum(r.prompt_n), 'num');
      cell(tr, fmtNum(r.cache_n), 'num');
      cell(tr, fmtNum(r.predicted_n), 'num');
      cell(tr, fmtNum(r.predicted_per_second, 1), 'num');
      cell(tr, r.stop_type ?? '');
      rr.push(tr);
    }
    if (!rr.length) { const tr = el('tr', 'empty-row'); cell(tr, 'no requests yet', 'none').colSpan = 9; rr.push(tr); }
    recent.replaceChildren(...rr);
    $('mon-updated').textContent = 'updated ' + new Date().toLocaleTimeString();
  }
  async function pollMonitor(gen) {
    pollTimer = null;
    try {
      const res = await fetch('/monitor', { headers: headers(false), cache: 'no-store' });
      if (!res.ok) throw new Error(await errorText(res));
      renderMonitor(await res.json());
      $('mon-error').replaceChildren();
      $('health-dot').className = 'dot up';
    } catch (e) {
      $('mon-error').replaceChildren(el('div', 'banner', 'Monitor: ' + ((e && e.message) || e)));
      $('health-dot').className = 'dot down';
    }
    if (gen === pollGen && !$('panel-monitor').hidden) pollTimer = setTimeout(() => pollMonitor(gen), 1000);
  }

  // ---- tabs ----
  function show(tab) {
    const monitor = tab === 'monitor';
    $('panel-chat').hidden = monitor;
    $('panel-monitor').hidden = !monitor;
    $('tab-chat').setAttribute('aria-selected', String(!monitor));
    $('tab-monitor').setAttribute('aria-selected', String(monitor));
    if (monitor) {
      loadProps();
      if (pollTimer) clearTimeout(pollTimer);
      pollMonitor(++pollGen);
    } else {
      ++pollGen;
      if (pollTimer) { clearTimeout(pollTimer); pollTimer = null; }
      $('input').focus();
    }
    if (location.hash !== '#' + tab) history_replace('#' + tab);
  }
  function history_replace(h) { try { window.history.replaceState(null, '', h); } catch { /* file: */ } }
  $('tab-chat').addEventListener('click', () => show('chat'));
  $('tab-monitor').addEventListener('click', () => show('monitor'));

  loadSettings();
  showEmpty();
  setBusy(false);
  loadProps();
  show(location.hash === '#monitor' ? 'monitor' : 'chat');
})();
</script>
</body>
</html>
)HTML";
  return kPage;
}

}  // namespace lamina::cli
