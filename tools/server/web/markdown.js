// Safe, incremental Markdown for streamed answers: marked (when the server embedded it) behind an
// allowlist sanitizer, and a renderer that never lays out the whole answer again per token.

const marked = globalThis.marked;  // absent: answers show as plain text

// Tags and attributes a rendered answer may hold; everything else becomes its text.
const ALLOWED_TAGS = new Set([
  'A', 'B', 'BLOCKQUOTE', 'BR', 'CODE', 'DEL', 'EM', 'H1', 'H2', 'H3', 'H4', 'H5', 'H6', 'HR', 'I',
  'INPUT', 'LI', 'OL', 'P', 'PRE', 'S', 'STRONG', 'TABLE', 'TBODY', 'TD', 'TH', 'THEAD', 'TR', 'UL',
]);
const ALLOWED_ATTRIBUTES = {
  A: ['href', 'title'], CODE: ['class'], OL: ['start'], TD: ['align'], TH: ['align'],
  INPUT: ['type', 'checked', 'disabled'],
};
const SAFE_URL = /^(https?:|mailto:|#|\/(?!\/))/i;

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) =>
    ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
}

function safeUrl(href) {
  const url = String(href ?? '').trim();
  return SAFE_URL.test(url) ? url : null;
}

// marked with raw HTML shown as text, links only to http(s)/mailto/this page, and images as
// links (an answer never makes the browser fetch anything).
const markedOptions = marked ? (() => {
  const renderer = new marked.Renderer();
  renderer.html = (html) => escapeHtml(html);
  // marked passes text (and title) already escaped, href as written.
  renderer.link = (href, title, text) => {
    const url = safeUrl(href);
    if (url === null) return text;
    const t = title ? ` title="${String(title).replace(/"/g, '&quot;')}"` : '';
    return `<a href="${escapeHtml(url)}"${t}>${text}</a>`;
  };
  renderer.image = (href, title, text) => {
    const url = safeUrl(href);
    const label = text || escapeHtml(href || 'image');
    return url === null ? label : `<a href="${escapeHtml(url)}">${label}</a>`;
  };
  return { renderer, gfm: true, breaks: true, mangle: false, headerIds: false };
})() : null;

// Keeps only ALLOWED_TAGS with their ALLOWED_ATTRIBUTES in a parsed (inert) fragment: any other
// element is replaced by its text. Links open in a new tab without access to this page.
function sanitize(root) {
  for (const node of [...root.childNodes]) {
    if (node.nodeType === Node.TEXT_NODE) continue;
    if (node.nodeType !== Node.ELEMENT_NODE || !ALLOWED_TAGS.has(node.tagName)) {
      node.replaceWith(document.createTextNode(node.nodeType === Node.ELEMENT_NODE ? node.textContent : ''));
      continue;
    }
    const keep = ALLOWED_ATTRIBUTES[node.tagName] || [];
    for (const attr of [...node.attributes]) {
      if (!keep.includes(attr.name)) node.removeAttribute(attr.name);
    }
    if (node.tagName === 'A') {
      const url = safeUrl(node.getAttribute('href'));
      if (url === null) node.removeAttribute('href');
      else { node.target = '_blank'; node.rel = 'noopener noreferrer'; }
    } else if (node.tagName === 'INPUT') {
      if (node.getAttribute('type') !== 'checkbox') { node.remove(); continue; }
      node.disabled = true;
    } else if (node.tagName === 'CODE' && !/^language-[\w+#.-]+$/.test(node.className)) {
      node.removeAttribute('class');
    }
    sanitize(node);
  }
}

// Markdown source → a sanitized DocumentFragment (plain text when marked is absent or fails).
export function renderMarkdown(source) {
  if (markedOptions) {
    try {
      const template = document.createElement('template');  // parsed inert: nothing loads or runs
      template.innerHTML = marked.parse(source, markedOptions);
      sanitize(template.content);
      return template.content;
    } catch { /* plain text below */ }
  }
  const fragment = document.createDocumentFragment();
  const div = document.createElement('div');
  div.className = 'plain';
  div.textContent = source;
  fragment.append(div);
  return fragment;
}

export const markdownAvailable = Boolean(markedOptions);

// A streamed text shown in a container as segments: a finished segment (blocks up to a blank
// line, a closed code fence, or at most SEGMENT_LINES lines) is rendered once and never touched
// again; only the unfinished tail is rendered again, at most once per animation frame. So a token
// costs the tail's few lines, never the whole answer.
const SEGMENT_LINES = 40;
const FENCE = /^ {0,3}(`{3,}|~{3,})([^`]*)$/;

export class MarkdownStream {
  // onRender: called after each frame that changed the container.
  constructor(container, onRender = null) {
    this.container = container;
    this.onRender = onRender;
    this.text = '';
    this.segmentStart = 0;  // where the unfinished segment begins in text
    this.scanPos = 0;       // the start of the first line not scanned yet
    this.segmentLines = 0;  // complete lines in the unfinished segment
    this.fence = null;      // {char, length, opener} while scanning inside a code fence
    this.fencePrefix = '';  // the opener line that the unfinished segment continues (forced split)
    this.afterBlank = false;
    this.continues = false;  // the unfinished segment continues the one before (forced split)
    this.tail = null;
    this.tailSource = null;
    this.scheduled = false;
    this.finished = false;
  }

  // Adds streamed text; it shows on the next animation frame.
  append(piece) {
    this.text += piece;
    if (this.scheduled) return;
    this.scheduled = true;
    const run = () => { this.scheduled = false; this.flush(); };
    if (document.hidden) setTimeout(run, 100); else requestAnimationFrame(run);
  }

  // Shows all the text now; with final, the tail becomes a finished segment too (and a frame
  // still scheduled does nothing).
  flush(final = false) {
    if (this.finished) return;
    this.scanLines();
    if (final) {
      this.finished = true;
      if (this.segmentStart < this.text.length || this.fencePrefix) this.commit(this.text.length, false);
      if (this.tail) { this.tail.remove(); this.tail = null; }
      if (this.onRender) this.onRender();
      return;
    }
    const source = this.fencePrefix + this.text.slice(this.segmentStart);
    if (source !== (this.tailSource ?? '')) {
      if (!this.tail) {
        this.tail = document.createElement('div');
        this.tail.className = 'seg tail' + (this.continues ? ' cont' : '');
        this.container.append(this.tail);
      }
      this.tail.replaceChildren(renderMarkdown(source));
      this.tailSource = source;
    }
    if (this.onRender) this.onRender();
  }

  // Walks the complete lines not scanned yet and finishes segments where a block ends.
  scanLines() {
    for (;;) {
      const nl = this.text.indexOf('\n', this.scanPos);
      if (nl < 0) return;
      const line = this.text.slice(this.scanPos, nl);
      const lineStart = this.scanPos;
      const lineEnd = nl + 1;
      if (this.fence) {
        this.scanPos = lineEnd;
        const m = FENCE.exec(line);
        if (m && m[1][0] === this.fence.char && m[1].length >= this.fence.length && !m[2].trim()) {
          this.fence = null;
          this.commit(lineEnd, false);
        } else if (++this.segmentLines >= SEGMENT_LINES) {
          this.commit(lineEnd, true, this.fence.opener + '\n');
        }
        continue;
      }
      const blank = line.trim() === '';
      const startsBlock = /^\S/.test(line);
      const opener = FENCE.exec(line);
      if (this.segmentLines > 0 && startsBlock) {
        if (this.afterBlank || (opener && !/^\s/.test(line))) {
          this.commit(lineStart, false);
        } else if (this.segmentLines >= SEGMENT_LINES && !this.afterBlank &&
                   !/^(=+|-+)\s*$/.test(line) && !line.startsWith('|')) {
          this.commit(lineStart, true);
        }
      } else if (this.segmentLines >= 4 * SEGMENT_LINES && !blank && !line.startsWith('|')) {
        this.commit(lineStart, true);  // a very long indented run: split anyway
      }
      if (opener) this.fence = { char: opener[1][0], length: opener[1].length, opener: line };
      this.afterBlank = blank;
      ++this.segmentLines;
      this.scanPos = lineEnd;
    }
  }

  // Renders text[segmentStart, end) as a finished segment. split: the next segment continues
  // this one's block (no gap between them); fencePrefix: the code fence the next one is inside.
  commit(end, split, fencePrefix = '') {
    const source = this.fencePrefix + this.text.slice(this.segmentStart, end);
    if (source.trim() === '') {  // blank lines between blocks: no segment
      if (this.tail) this.tail.remove();
    } else {
      const segment = this.tail || document.createElement('div');
      segment.className = 'seg' + (this.continues ? ' cont' : '') + (split ? ' split' : '');
      if (source !== this.tailSource) segment.replaceChildren(renderMarkdown(source));
      if (!this.tail) this.container.append(segment);
    }
    this.tail = null;
    this.tailSource = null;
    this.segmentStart = end;
    this.segmentLines = 0;
    this.afterBlank = false;
    this.fencePrefix = fencePrefix;
    this.continues = split;
  }
}
