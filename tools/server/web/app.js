// lamina's web chat and monitor (index.html): streamed chat with past chats kept in this browser,
// sampling settings, a server status dot and the monitor tab. No framework, no build step.
//
// Chat: POST /v1/chat/completions with stream: true, read as server-sent events (content and
// reasoning_content deltas); Stop aborts the fetch (the server cancels the request when its
// stream write fails). Health: GET /health every 2 s. Monitor: GET /monitor every second while
// its tab is shown, GET /props when it opens. Model output reaches the page only as text or as
// sanitized Markdown (markdown.js). Stable ids for tests/web_ui_test.mjs: #input, #send, #stop,
// #new-chat, #chat-list, #export-json, #export-md, #theme-toggle, #health-dot, #messages
// (.msg.user / .msg.assistant, .done when finished, .content, .meta, .thinking, .copy),
// #temperature #top_k #top_p #min_p #max_tokens #seed #system #api-key, #tab-chat, #tab-monitor,
// #slots and #recent (table bodies), #mon-model, #mon-kv, #mon-tps, #props-slots, #props-nctx.
import { MarkdownStream } from './markdown.js';

const $ = (id) => document.getElementById(id);
const SETTINGS = ['temperature', 'top_k', 'top_p', 'min_p', 'max_tokens', 'seed'];
const INTS = new Set(['top_k', 'max_tokens', 'seed']);
const narrow = window.matchMedia('(max-width: 860px)');  // style.css's narrow layout
const store = {
  get(key, fallback) {
    try { const v = localStorage.getItem(key); return v === null ? fallback : v; } catch { return fallback; }
  },
  set(key, value) {
    try { localStorage.setItem(key, value); return true; } catch { return false; }  // full, or private mode
  },
  remove(key) { try { localStorage.removeItem(key); } catch { /* private mode */ } },
  json(key, fallback) {
    try { return JSON.parse(store.get(key, 'null')) ?? fallback; } catch { return fallback; }
  },
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
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; ++i; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + ' ' + units[i];
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
async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {  // no clipboard API (a plain-http page off localhost): the old way
    const area = el('textarea');
    area.value = text;
    area.className = 'offscreen';
    document.body.append(area);
    area.select();
    const ok = document.execCommand('copy');
    area.remove();
    return ok;
  }
}
function download(name, type, text) {
  const a = el('a');
  a.href = URL.createObjectURL(new Blob([text], { type }));
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
}

// ---- theme: follows the system until the toggle picks dark or light ----
const THEMES = ['auto', 'dark', 'light'];
function applyTheme(theme) {
  if (theme === 'auto') delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = theme;
  $('theme-toggle').title = theme === 'auto' ? 'Theme: follows the system' : 'Theme: ' + theme;
  $('theme-toggle').textContent = { auto: '◐', dark: '☾', light: '☀' }[theme];
}
$('theme-toggle').addEventListener('click', () => {
  const current = store.get('lamina.theme', 'auto');
  const next = THEMES[(THEMES.indexOf(current) + 1) % THEMES.length];
  store.set('lamina.theme', next);
  applyTheme(next);
});
applyTheme(THEMES.includes(store.get('lamina.theme', 'auto')) ? store.get('lamina.theme', 'auto') : 'auto');

// ---- settings ----
function loadSettings() {
  const saved = store.json('lamina.settings', {});
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

// ---- server status: /health every 2 s (green: ok, amber: loading, red: unreachable) ----
let serverUp = null;
function setDot(state, title) {
  $('health-dot').className = 'dot ' + state;
  $('health-dot').title = title;
  $('health-dot').dataset.state = state;
}
async function pollHealth() {
  if (!document.hidden) {
    try {
      const res = await fetch('/health', { cache: 'no-store', signal: AbortSignal.timeout(2500) });
      if (res.ok) setDot('up', 'server: ok');
      else if (res.status === 503) setDot('loading', 'server: loading the model');
      else setDot('down', 'server: ' + await errorText(res));
      if (res.ok && serverUp === false) loadProps();  // back after a restart
      serverUp = res.ok;
    } catch (e) {
      setDot('down', 'server unreachable: ' + ((e && e.message) || e));
      serverUp = false;
    }
  }
  setTimeout(pollHealth, 2000);
}
document.addEventListener('visibilitychange', () => { if (!document.hidden) loadProps(); });

// ---- server basics (/props) ----
async function loadProps() {
  try {
    const res = await fetch('/props', { headers: headers(false) });
    if (!res.ok) throw new Error(await errorText(res));
    const props = await res.json();
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
  } catch { /* the status dot and the chat's error line say why */ }
}

// ---- past chats: localStorage "lamina.chats" (the list), "lamina.chat.<id>" (each chat) ----
// A chat: {id, title, created, updated, messages: [{role, content, reasoning_content?,
// thinking_ms?, meta?, error?, failed?}]}; it is stored from its first message on.
let chat = null;  // the chat shown; null: a new, empty one
function chatIndex() { return store.json('lamina.chats', []).filter((c) => c && c.id); }
function titleOf(messages) {
  const first = messages.find((m) => m.role === 'user');
  const line = first ? first.content.trim().split('\n')[0] : '';
  return line.length > 60 ? line.slice(0, 57) + '…' : line || 'New chat';
}
function saveChat(c) {
  c.updated = Date.now();
  c.title = titleOf(c.messages);
  const entry = { id: c.id, title: c.title, updated: c.updated };
  const index = [entry, ...chatIndex().filter((e) => e.id !== c.id)];
  // When the browser's storage is full, the oldest chats make room.
  while (!store.set('lamina.chat.' + c.id, JSON.stringify(c)) && index.length > 1) {
    store.remove('lamina.chat.' + index.pop().id);
  }
  store.set('lamina.chats', JSON.stringify(index));
  if (chat === c) store.set('lamina.currentChat', c.id);  // not when another chat was opened since
  renderChatList();
}
let saveTimer = null;
function saveChatSoon(c) {  // at most once a second while an answer streams
  if (!saveTimer) saveTimer = setTimeout(() => { saveTimer = null; saveChat(c); }, 1000);
}
function renderChatList() {
  const items = chatIndex().map((entry) => {
    const li = el('li');
    const b = el('button', 'chat-item' + (chat && chat.id === entry.id ? ' active' : ''));
    b.append(el('span', 'chat-item-title', entry.title || 'New chat'),
             el('span', 'chat-item-time', new Date(entry.updated).toLocaleString()));
    b.addEventListener('click', () => openChat(entry.id));
    li.append(b);
    return li;
  });
  $('chat-list').replaceChildren(...items);
  $('chat-title').textContent = chat ? chat.title : 'New chat';
  for (const id of ['export-json', 'export-md', 'delete-chat']) $(id).disabled = !chat;
}
function openChat(id) {
  stop();
  const c = id ? store.json('lamina.chat.' + id, null) : null;
  chat = c && Array.isArray(c.messages) ? c : null;
  // An answer the page was closed on before any of it came: left out like a failed turn.
  chat?.messages.forEach((m, i) => {
    if (m.pending && !m.content && !m.reasoning_content) {
      m.failed = true;
      if (chat.messages[i - 1]?.role === 'user') chat.messages[i - 1].failed = true;
    }
  });
  if (chat) store.set('lamina.currentChat', chat.id); else store.remove('lamina.currentChat');
  thread.replaceChildren();
  if (!chat || !chat.messages.length) showEmpty();
  for (const m of chat ? chat.messages : []) renderStoredMessage(m);
  renderChatList();
  stick = true;
  toBottom();
  if (narrow.matches) $('chats').classList.add('closed');
}
function newChat() {
  openChat(null);
  $('input').focus();
}
$('new-chat').addEventListener('click', newChat);
$('delete-chat').addEventListener('click', () => {
  if (!chat || !confirm('Delete this chat from this browser?')) return;
  store.remove('lamina.chat.' + chat.id);
  store.set('lamina.chats', JSON.stringify(chatIndex().filter((e) => e.id !== chat.id)));
  openChat(null);
});
window.addEventListener('storage', (e) => { if (e.key === 'lamina.chats') renderChatList(); });

function exportName(ext) {
  const d = new Date(chat.created || Date.now());
  const pad = (n) => String(n).padStart(2, '0');
  return `lamina-chat-${d.getFullYear()}${pad(d.getMonth() + 1)}${pad(d.getDate())}-` +
         `${pad(d.getHours())}${pad(d.getMinutes())}.${ext}`;
}
$('export-json').addEventListener('click', () => {
  if (!chat) return;
  const messages = chat.messages.map((m) => {
    const out = { role: m.role, content: m.content };
    if (m.reasoning_content) out.reasoning_content = m.reasoning_content;
    if (m.error) out.error = m.error;
    return out;
  });
  const doc = { title: chat.title, created: new Date(chat.created).toISOString(),
                model: $('model-name').textContent || undefined, messages };
  download(exportName('json'), 'application/json', JSON.stringify(doc, null, 2) + '\n');
});
$('export-md').addEventListener('click', () => {
  if (!chat) return;
  let out = `# ${chat.title}\n`;
  for (const m of chat.messages) {
    out += `\n## ${m.role === 'user' ? 'You' : 'lamina'}\n\n`;
    if (m.reasoning_content) {
      out += `<details><summary>Thinking</summary>\n\n${m.reasoning_content}\n\n</details>\n\n`;
    }
    out += m.content + '\n';
  }
  download(exportName('md'), 'text/markdown', out);
});

// ---- chat thread ----
const thread = $('thread');
const scroller = $('messages');
let controller = null;  // the AbortController of the answer being generated
let stick = true;       // follow the answer down unless the reader scrolled up
function nearBottom() { return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 80; }
function toBottom() { scroller.scrollTop = scroller.scrollHeight; }
scroller.addEventListener('scroll', () => { stick = nearBottom(); }, { passive: true });
function followAnswer() { if (stick) toBottom(); }

function showEmpty() {
  thread.replaceChildren();
  const box = el('div', 'empty');
  box.append(el('h2', null, 'Chat with lamina'));
  box.append(el('div', null, 'Answers stream as they are generated. Sampling settings are on the right.'));
  const examples = el('div', 'examples');
  for (const t of ['Count from 1 to 20, one number per line.', 'Count from 1 to 100, one number per line.']) {
    const b = el('button', null, t);
    b.addEventListener('click', () => { $('input').value = t; autosize(); $('input').focus(); });
    examples.append(b);
  }
  box.append(examples);
  box.id = 'empty';
  thread.append(box);
}

// One message's elements; for the assistant, Markdown streams into .content and the reasoning
// into a collapsed "Thinking" block above it.
function addMessageView(msg) {
  const empty = $('empty');
  if (empty) empty.remove();
  const m = el('div', 'msg ' + msg.role);
  m.append(el('div', 'role', msg.role === 'user' ? 'You' : 'lamina'));
  const view = { root: m, msg };
  if (msg.role === 'assistant') {
    const thinking = el('details', 'thinking');
    thinking.hidden = true;
    const summary = el('summary', null, 'Thinking…');
    const reasoning = el('div', 'reasoning');
    thinking.append(summary, reasoning);
    m.append(thinking);
    view.thinking = thinking;
    view.summary = summary;
    view.reasoning = new MarkdownStream(reasoning, followAnswer);
  }
  const content = el('div', 'content');
  m.append(content);
  if (msg.role === 'assistant') view.content = new MarkdownStream(content, followAnswer);
  else content.textContent = msg.content;
  view.meta = el('div', 'meta');
  const copy = el('button', 'copy', 'Copy');
  copy.title = 'Copy this message (Markdown)';
  copy.addEventListener('click', async () => {
    copy.textContent = await copyText(msg.content) ? 'Copied' : 'Copy failed';
    setTimeout(() => { copy.textContent = 'Copy'; }, 1200);
  });
  const foot = el('div', 'foot');
  foot.append(view.meta, copy);
  m.append(foot);
  thread.append(m);
  return view;
}
function showThinkingTime(view, ms) {
  view.summary.textContent = ms >= 0 ? `Thought for ${(ms / 1000).toFixed(1)} s` : 'Thinking';
}
function renderStoredMessage(msg) {
  const view = addMessageView(msg);
  if (msg.role === 'assistant') {
    if (msg.reasoning_content) {
      view.thinking.hidden = false;
      view.reasoning.append(msg.reasoning_content);
      view.reasoning.flush(true);
      showThinkingTime(view, msg.thinking_ms ?? -1);
    }
    view.content.append(msg.content);
    view.content.flush(true);
  }
  view.meta.textContent = msg.pending ? 'interrupted' : msg.meta || '';
  if (msg.failed) view.root.classList.add('failed');
  if (msg.error) view.root.append(el('div', 'error', msg.error));
  view.root.classList.add('done');
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

// Reads a server-sent-event body, calling onData with each "data:" payload until [DONE].
async function readEvents(res, onData) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let done = false;
  const line = (l) => {
    if (l.endsWith('\r')) l = l.slice(0, -1);
    if (!l.startsWith('data:')) return;
    const data = l.slice(5).trimStart();
    if (data === '[DONE]') done = true; else onData(data);
  };
  while (!done) {
    const { value, done: end } = await reader.read();
    if (end) break;
    buf += decoder.decode(value, { stream: true });
    let start = 0;
    let nl;
    while (!done && (nl = buf.indexOf('\n', start)) >= 0) {
      line(buf.slice(start, nl));
      start = nl + 1;
    }
    buf = buf.slice(start);
  }
  buf += decoder.decode();
  if (!done && buf) line(buf);
  if (done) reader.cancel().catch(() => {});
}

async function send() {
  const text = $('input').value;
  if (controller || text.trim() === '') return;
  $('input').value = '';
  autosize();
  saveSettings();
  if (!chat) chat = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8),
                      created: Date.now(), messages: [] };
  const c = chat;
  const user = { role: 'user', content: text };
  c.messages.push(user);
  const messages = [];
  const system = $('system').value.trim();
  if (system) messages.push({ role: 'system', content: system });
  for (const m of c.messages) if (!m.failed) messages.push({ role: m.role, content: m.content });
  const body = Object.assign({ messages, stream: true }, samplingFields());

  const u = addMessageView(user);
  u.root.classList.add('done');
  const answer = { role: 'assistant', content: '', pending: true };
  c.messages.push(answer);
  saveChat(c);
  const view = addMessageView(answer);
  const m = view.root;
  m.classList.add('streaming');
  stick = true;
  toBottom();
  let final = null;  // the chunk with finish_reason (or the timings)
  let error = null;
  let stopped = false;
  const t0 = performance.now();
  let firstAt = 0, pieces = 0, thinkingFrom = 0;
  controller = new AbortController();
  setBusy(true);
  try {
    const res = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(true), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    await readEvents(res, (data) => {
      let j;
      try { j = JSON.parse(data); } catch { return; }
      if (j.error) {
        error = j.error.message || JSON.stringify(j.error);
        return;
      }
      const choice = (j.choices || [])[0];
      if (choice) {
        const delta = choice.delta || {};
        const thought = delta.reasoning_content;
        if (typeof thought === 'string' && thought !== '') {
          if (!thinkingFrom) { thinkingFrom = performance.now(); view.thinking.hidden = false; }
          answer.reasoning_content = (answer.reasoning_content || '') + thought;
          view.reasoning.append(thought);
        }
        const piece = delta.content;
        if (typeof piece === 'string' && piece !== '') {
          if (!firstAt) firstAt = performance.now();
          if (thinkingFrom && answer.thinking_ms === undefined) {
            answer.thinking_ms = Math.round(firstAt - thinkingFrom);
            showThinkingTime(view, answer.thinking_ms);
          }
          ++pieces;
          answer.content += piece;
          view.content.append(piece);
        }
        if (choice.finish_reason) final = j;
      }
      if (j.timings && !final) final = j;
      saveChatSoon(c);
    });
  } catch (e) {
    if (e && e.name === 'AbortError') stopped = true;
    else error = String((e && e.message) || e);
  } finally {
    controller = null;
    setBusy(false);
  }
  view.reasoning.flush(true);
  view.content.flush(true);
  m.classList.remove('streaming');
  if (thinkingFrom && answer.thinking_ms === undefined) {
    answer.thinking_ms = Math.round(performance.now() - thinkingFrom);
    showThinkingTime(view, answer.thinking_ms);
  }
  delete answer.pending;
  if (answer.content === '' && !answer.reasoning_content) {
    // Nothing came back: the turn is left out of the conversation the model sees next.
    user.failed = answer.failed = true;
    u.root.classList.add('failed');
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
  answer.meta = view.meta.textContent = parts.join(' · ');
  if (error) {
    answer.error = error;
    m.append(el('div', 'error', error));
  }
  if (saveTimer) { clearTimeout(saveTimer); saveTimer = null; }
  saveChat(c);
  m.classList.add('done');
  followAnswer();
  if (chat === c) $('input').focus();
}

function stop() { if (controller) controller.abort(); }
$('send').addEventListener('click', send);
$('stop').addEventListener('click', stop);
$('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  }
});
$('input').addEventListener('input', autosize);
$('settings-toggle').addEventListener('click', () => $('settings').classList.toggle('closed'));
$('settings-close').addEventListener('click', () => $('settings').classList.add('closed'));
$('chats-toggle').addEventListener('click', () => $('chats').classList.toggle('closed'));
// Narrow windows: the chats and the settings open over the thread, closed until asked for.
function closeSidePanels() {
  if (!narrow.matches) return;
  $('settings').classList.add('closed');
  $('chats').classList.add('closed');
}
narrow.addEventListener('change', closeSidePanels);
closeSidePanels();

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
  $('mon-kv').textContent = (kv.type ?? '–') +
      (typeof kv.bits_per_element === 'number' ? ' · ' + +kv.bits_per_element.toFixed(2) + ' bits' : '');
  $('mon-kv-bytes').textContent = fmtBytes(kv.bytes_used) + ' used of ' + fmtBytes(kv.bytes_total);
  $('mon-kv-bar').style.width =
      (kv.bytes_total > 0 ? Math.min(100, 100 * kv.bytes_used / kv.bytes_total) : 0).toFixed(1) + '%';
  $('mon-tps').textContent = fmtNum(m.predicted_per_second, 1);
  $('mon-pps').textContent = 'generation; prompt ' + fmtNum(m.prompt_per_second, 1) + ' tok/s';
  $('mon-total').textContent = fmtNum(m.tokens_predicted_total) + ' generated';
  $('mon-queued').textContent = fmtNum(m.prompt_tokens_total) + ' prompt tokens · ' + fmtNum(m.queued) + ' queued';

  const rows = [];
  for (const s of m.slots || []) {
    const tr = el('tr');
    cell(tr, s.id, 'num');
    const state = el('td');
    state.append(el('span', 'badge' + (s.busy ? ' busy' : ''), s.busy ? 'busy' : 'idle'));
    tr.append(state);
    const fill = el('td');
    fill.append(fillBar(s.n_past, s.n_ctx));
    tr.append(fill);
    cell(tr, fmtNum(s.n_prompt), 'num');
    cell(tr, fmtNum(s.n_decoded), 'num');
    rows.push(tr);
  }
  if (!rows.length) { const tr = el('tr'); cell(tr, 'no slots', 'none').colSpan = 5; rows.push(tr); }
  $('slots').replaceChildren(...rows);

  const recent = [];
  for (const r of m.recent || []) {
    const tr = el('tr');
    cell(tr, typeof r.finished_at === 'number' ? new Date(r.finished_at * 1000).toLocaleTimeString() : '–');
    cell(tr, r.route);
    const status = el('td');
    status.append(el('span', 'badge ' + (r.status === 200 ? 'ok' : 'err'), r.status));
    tr.append(status);
    cell(tr, r.slot, 'num');
    cell(tr, fmtNum(r.prompt_n), 'num');
    cell(tr, fmtNum(r.cache_n), 'num');
    cell(tr, fmtNum(r.predicted_n), 'num');
    cell(tr, fmtNum(r.predicted_per_second, 1), 'num');
    cell(tr, r.stop_type ?? '');
    recent.push(tr);
  }
  if (!recent.length) { const tr = el('tr', 'empty-row'); cell(tr, 'no requests yet', 'none').colSpan = 9; recent.push(tr); }
  $('recent').replaceChildren(...recent);
  $('mon-updated').textContent = 'updated ' + new Date().toLocaleTimeString();
}
async function pollMonitor(gen) {
  pollTimer = null;
  try {
    const res = await fetch('/monitor', { headers: headers(false), cache: 'no-store' });
    if (!res.ok) throw new Error(await errorText(res));
    renderMonitor(await res.json());
    $('mon-error').replaceChildren();
  } catch (e) {
    $('mon-error').replaceChildren(el('div', 'banner', 'Monitor: ' + ((e && e.message) || e)));
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
  if (location.hash !== '#' + tab) {
    try { window.history.replaceState(null, '', '#' + tab); } catch { /* file: */ }
  }
}
$('tab-chat').addEventListener('click', () => show('chat'));
$('tab-monitor').addEventListener('click', () => show('monitor'));

loadSettings();
setBusy(false);
openChat(store.get('lamina.currentChat', null));
loadProps();
pollHealth();
show(location.hash === '#monitor' ? 'monitor' : 'chat');
