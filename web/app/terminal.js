// /web/nodes/{node}/terminal?login=L: xterm.js over the proxy's terminal WebSocket
// (sallyport.term.v1). Bytes go both ways as binary frames and into term.write as a
// Uint8Array, whose decoder keeps a UTF-8 character split across frames whole. Text frames are
// JSON: resize in; session, exit and error out. When the socket closes the page says why (by
// close code) and offers a new session.

import { Terminal } from '/web/assets/vendor/xterm/xterm.mjs';
import { FitAddon } from '/web/assets/vendor/addon-fit/addon-fit.mjs';
import { h, show } from './dom.js';
import { onLeave } from './main.js';

const PROTOCOL = 'sallyport.term.v1';
const MAX_FRAME = 32 * 1024;

/** What the page says when the socket closed with `code`. */
export function closeReason(code, exit, error) {
  switch (code) {
    case 1000:
      return exit !== null ? `The session ended with exit status ${exit}.` : 'The session ended.';
    case 4401:
      return 'You are not signed in, or your web session ended (signed out, idle or expired). Sign in again to start a new session.';
    case 4403:
      return `Refused: ${error || 'your roles do not allow this login on this server.'}`;
    case 4408:
      return 'The session was closed after being idle too long.';
    case 4409:
      return `Your user is locked${error ? `: ${error}` : '.'}`;
    case 1008:
      return `The proxy closed the session: it got a message it does not understand${error ? ` (${error})` : '.'}`;
    case 1009:
      return 'The proxy closed the session: a message was larger than 64 KiB.';
    case 1011:
      return `The server could not be reached${error ? `: ${error}` : '.'}`;
    default:
      return `The connection to the proxy dropped (code ${code})${error ? `: ${error}` : '.'}`;
  }
}

/** xterm.js's stylesheet, loaded before the terminal opens so that its first fit measures right. */
function ensureCss() {
  if (document.querySelector('link[data-xterm]')) return Promise.resolve();
  return new Promise((resolve) => {
    const link = h('link', { rel: 'stylesheet', href: '/web/assets/vendor/xterm/xterm.css', 'data-xterm': true });
    link.addEventListener('load', resolve);
    link.addEventListener('error', resolve);
    document.head.append(link);
  });
}

export async function render(node, login) {
  await ensureCss();
  const title = `${login}@${node}`;
  const info = h('span', { class: 'term-info', id: 'term-info', role: 'status', 'aria-live': 'polite', text: 'Connecting…' });
  const size = h('span', { class: 'term-size', id: 'term-size' });
  const sr = h('input', { type: 'checkbox', id: 'sr-mode' });
  const box = h('div', { class: 'term', id: 'term', 'data-state': 'connecting' });
  const ended = h('div', { class: 'ended', id: 'term-ended', role: 'alert', hidden: true });
  show(title,
    h('div', { class: 'term-page' },
      h('div', { class: 'term-bar' },
        h('h1', { text: title }), info, size,
        h('label', { class: 'sr-toggle' }, sr, ' Screen reader mode'),
        h('a', { href: '/web/nodes', text: 'Servers' })),
      box, ended));
  if (!login) {
    box.dataset.state = 'closed';
    ended.hidden = false;
    ended.replaceChildren(h('p', { text: 'Choose a login for this server first.' }), h('a', { href: '/web/nodes', text: 'Back to the servers' }));
    return;
  }

  const term = new Terminal({
    scrollback: 10000,
    // A steady cursor. xterm.js blinks its DOM cursor with an endless CSS animation, which keeps
    // a frame always pending; Chromium then holds every task after a keystroke (the echo's
    // WebSocket message included) until that frame is drawn: up to 16.7 ms on each key, about
    // 10 ms at the median (bench/RESULTS.md, bench/web.sh). It also redraws 60 times a second.
    cursorBlink: false,
    fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
    fontSize: 14,
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  const refit = () => { try { fit.fit(); } catch (e) { /* hidden or detached */ } };
  refit();
  sr.addEventListener('change', () => { term.options.screenReaderMode = sr.checked; });

  const encoder = new TextEncoder();
  let ws = null;
  let exit = null;
  let error = null;
  let leaving = false;

  const showSize = () => {
    size.textContent = `${term.cols}×${term.rows}`;
    box.dataset.cols = term.cols;
    box.dataset.rows = term.rows;
  };
  showSize();
  const send = (data) => { if (ws && ws.readyState === WebSocket.OPEN) ws.send(data); };
  // The proxy closes on a frame over 64 KiB (1009): a large paste goes as many frames, in order.
  const sendBytes = (bytes) => {
    for (let i = 0; i < bytes.length; i += MAX_FRAME) send(bytes.subarray(i, i + MAX_FRAME));
  };
  term.onData((s) => sendBytes(encoder.encode(s)));
  term.onBinary((s) => sendBytes(Uint8Array.from(s, (c) => c.charCodeAt(0) & 0xff)));
  term.onResize(({ cols, rows }) => {
    showSize();
    send(JSON.stringify({ type: 'resize', cols, rows }));
  });
  // The box follows the window (and any layout change); the terminal follows the box.
  let pending = false;
  const observer = new ResizeObserver(() => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; refit(); });
  });
  observer.observe(box);

  // Copy: Ctrl+Shift+C (Cmd+C). Paste: Ctrl+Shift+V, Cmd+V, Shift+Insert — not handled here
  // but left to the browser's own paste event, which xterm.js turns into a bracketed paste when
  // the program asked for it.
  term.attachCustomKeyEventHandler((e) => {
    if (e.type !== 'keydown') return true;
    const key = e.key.toLowerCase();
    const copy = (e.ctrlKey && e.shiftKey && key === 'c') || (e.metaKey && !e.ctrlKey && key === 'c');
    if (copy) {
      const text = term.getSelection();
      if (text && navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
      e.preventDefault();
      return false;
    }
    const paste = (e.ctrlKey && e.shiftKey && key === 'v') || (e.metaKey && !e.ctrlKey && key === 'v')
      || (e.shiftKey && e.key === 'Insert');
    return !paste;
  });

  const connect = () => {
    exit = null;
    error = null;
    ended.hidden = true;
    box.dataset.state = 'connecting';
    info.textContent = 'Connecting…';
    const q = new URLSearchParams({ node, login, cols: String(term.cols), rows: String(term.rows) });
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    ws = new WebSocket(`${scheme}://${location.host}/v1/webapi/terminal?${q}`, PROTOCOL);
    ws.binaryType = 'arraybuffer';
    ws.onmessage = (m) => {
      if (m.data instanceof ArrayBuffer) {
        term.write(new Uint8Array(m.data));
        return;
      }
      let msg;
      try { msg = JSON.parse(m.data); } catch (e) { return; }
      if (msg.type === 'session') {
        box.dataset.state = 'open';
        box.dataset.session = String(msg.id);
        info.textContent = `Session ${msg.id}`;
      } else if (msg.type === 'exit') {
        exit = msg.status;
      } else if (msg.type === 'error') {
        error = String(msg.message);
      }
    };
    ws.onclose = (c) => {
      if (leaving) return;
      box.dataset.state = 'closed';
      box.dataset.closeCode = String(c.code);
      info.textContent = 'Ended';
      const reason = closeReason(c.code, exit, error || c.reason || null);
      const again = c.code === 4401
        ? h('a', { href: `/web/login?next=${encodeURIComponent(location.pathname + location.search)}`, text: 'Sign in' })
        : h('button', { type: 'button', text: 'New session', onclick: () => { term.reset(); connect(); term.focus(); } });
      ended.replaceChildren(h('p', { id: 'term-reason', text: reason }), again, ' ',
        h('a', { href: '/web/nodes', text: 'Back to the servers' }));
      ended.hidden = false;
    };
  };
  connect();
  term.focus();

  onLeave(() => {
    leaving = true;
    observer.disconnect();
    if (ws) ws.close(1000);
    term.dispose();
  });
}
