// /web/recordings: the sessions the user may replay (auth's scope of `sally recordings ls`:
// one's own, everyone's for an auditor), and /web/recordings/{id}: the player.
//
// The player is asciinema-player (vendored, a WASM terminal: its page is the one whose CSP
// has 'wasm-unsafe-eval', so main.js always reaches it by a full load). It loads the whole
// cast into the tab, so past MAX_PLAYABLE the page offers the file and `sally play` instead.
// The player has no speed or idle setter: changing either makes a new player at the same place.

import { h, show } from './dom.js';
import { api } from './api.js';
import { go } from './main.js';

/** Larger casts are not loaded into the page (asciinema-player holds the whole file). */
export const MAX_PLAYABLE = 64 * 1024 * 1024;
export const SPEEDS = [0.5, 1, 1.5, 2, 3, 4];
/** Idle skip: pauses longer than this play as this long. */
export const IDLE_LIMIT = 2;

export function bytes(n) {
  if (n === null || n === undefined) return '—';
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  if (n < 1024 * 1024 * 1024) return `${(n / 1024 / 1024).toFixed(1)} MiB`;
  return `${(n / 1024 / 1024 / 1024).toFixed(2)} GiB`;
}

export function clock(secs) {
  if (!Number.isFinite(secs) || secs < 0) return '—';
  const s = Math.floor(secs);
  const hh = Math.floor(s / 3600);
  const mm = String(Math.floor((s % 3600) / 60)).padStart(hh ? 2 : 1, '0');
  const ss = String(s % 60).padStart(2, '0');
  return hh ? `${hh}:${mm}:${ss}` : `${mm}:${ss}`;
}

/** A position in the player, to a tenth of a second. */
export function position(secs) {
  if (!Number.isFinite(secs) || secs < 0) return '—';
  return `${clock(secs)}.${Math.floor((secs * 10) % 10)}`;
}

/** A session's length from its record, or "running". */
export function duration(s) {
  if (!s.end) return 'running';
  const d = (Date.parse(s.end) - Date.parse(s.start)) / 1000;
  return clock(d);
}

function when(t) {
  const d = new Date(t);
  return Number.isNaN(d.getTime()) ? String(t) : d.toLocaleString();
}

export function playerPath(id) { return `/web/recordings/${encodeURIComponent(id)}`; }
export function castPath(id) { return `/v1/webapi/recordings/${encodeURIComponent(id)}/cast`; }

function unauthorized(e, path) {
  if (e.status === 401) {
    go(`/web/login?next=${encodeURIComponent(path)}`, true);
    return true;
  }
  return false;
}

export async function renderList() {
  const status = h('p', { id: 'recordings-status', class: 'status', role: 'status', 'aria-live': 'polite', text: 'Loading…' });
  const tbody = h('tbody');
  show('Recordings',
    h('h1', { text: 'Recordings' }),
    status,
    h('table', { class: 'grid', id: 'recordings' },
      h('caption', { class: 'visually-hidden', text: 'Recorded sessions you may replay, newest first' }),
      h('thead', {}, h('tr', {},
        ['Session', 'User', 'Server', 'Login', 'Start', 'Duration', 'Size'].map((t) => h('th', { scope: 'col', text: t })))),
      tbody));
  let list;
  try {
    list = await api('GET', '/v1/webapi/recordings');
  } catch (e) {
    if (unauthorized(e, '/web/recordings')) return;
    status.classList.add('error');
    status.textContent = `Cannot list the recordings: ${e.message}`;
    return;
  }
  list.reverse();
  const sizes = new Map();
  tbody.replaceChildren(...list.map((s) => {
    const size = h('td', { class: 'num', text: '…' });
    sizes.set(s.session_id, size);
    return h('tr', { 'data-session': s.session_id },
      h('th', { scope: 'row' }, h('a', { href: playerPath(s.session_id), text: s.session_id.slice(0, 8), 'aria-label': `Play session ${s.session_id}` })),
      h('td', { text: s.user }),
      h('td', { text: s.node }),
      h('td', { text: s.login }),
      h('td', {}, h('time', { datetime: s.start, text: when(s.start) })),
      h('td', { text: duration(s) }),
      size);
  }));
  status.textContent = list.length === 0 ? 'No recorded sessions you may replay.' : `${list.length} sessions.`;
  // The list carries no sizes; each session's record does. A few at a time, newest first.
  const queue = list.slice(0, 200);
  const worker = async () => {
    for (let s = queue.shift(); s; s = queue.shift()) {
      try {
        const d = await api('GET', `/v1/webapi/recordings/${encodeURIComponent(s.session_id)}`);
        sizes.get(s.session_id).textContent = d.recording_size === null || d.recording_size === undefined ? 'none' : bytes(d.recording_size);
      } catch (e) {
        sizes.get(s.session_id).textContent = '—';
      }
    }
  };
  await Promise.all([worker(), worker(), worker()]);
  for (const td of sizes.values()) if (td.textContent === '…') td.textContent = '—';
}

/** asciinema-player's script (a classic script defining AsciinemaPlayer) and stylesheet. */
function loadPlayer() {
  const css = new Promise((resolve) => {
    const link = h('link', { rel: 'stylesheet', href: '/web/assets/vendor/asciinema-player/asciinema-player.css' });
    link.addEventListener('load', resolve);
    link.addEventListener('error', resolve);
    document.head.append(link);
  });
  const js = new Promise((resolve, reject) => {
    if (globalThis.AsciinemaPlayer) { resolve(); return; }
    const s = h('script', { src: '/web/assets/vendor/asciinema-player/asciinema-player.min.js' });
    s.addEventListener('load', resolve);
    s.addEventListener('error', () => reject(new Error('the player could not be loaded')));
    document.head.append(s);
  });
  return Promise.all([css, js]);
}

export async function renderPlayer(id) {
  const here = playerPath(id);
  const title = `Recording ${id.slice(0, 8)}`;
  show(title, h('h1', { text: title }), h('p', { class: 'status', role: 'status', text: 'Loading…' }));
  let d;
  try {
    d = await api('GET', `/v1/webapi/recordings/${encodeURIComponent(id)}`);
  } catch (e) {
    if (unauthorized(e, here)) return;
    show(title, h('h1', { text: title }),
      h('p', { class: 'error', role: 'alert', text: `Cannot open this recording: ${e.message}` }),
      h('p', {}, h('a', { href: '/web/recordings', text: 'All recordings' })));
    return;
  }
  const about = h('dl', { class: 'about' },
    ...[['User', d.user], ['Server', d.node], ['Login', d.login], ['Start', when(d.start)],
      ['Duration', duration(d)], ['Size', bytes(d.recording_size)]]
      .flatMap(([k, v]) => [h('dt', { text: k }), h('dd', { text: v })]));
  const back = h('p', {}, h('a', { href: '/web/recordings', text: 'All recordings' }));
  const download = h('a', { class: 'button', href: castPath(id), download: `${id}.cast`, text: 'Download the recording (.cast)' });

  if (d.recording_size === null || d.recording_size === undefined) {
    show(title, h('h1', { text: title }), about,
      h('p', { role: 'alert', text: 'No recording was kept for this session.' }), back);
    return;
  }
  if (d.recording_size > MAX_PLAYABLE) {
    show(title, h('h1', { text: title }), about,
      h('div', { class: 'card', id: 'too-large' },
        h('p', { text: `This recording is ${bytes(d.recording_size)}: too large to play in the browser (over ${bytes(MAX_PLAYABLE)}). Download it, or play it in a terminal:` }),
        h('pre', {}, h('code', { id: 'play-command', text: `sally play ${id}` })),
        download),
      back);
    return;
  }

  const box = h('div', { class: 'player', id: 'player', 'data-state': 'loading' });
  const playBtn = h('button', { type: 'button', id: 'play', text: 'Play', 'aria-keyshortcuts': 'k' });
  const seek = h('input', {
    type: 'range', id: 'seek', min: '0', max: '0', step: '0.1', value: '0',
    'aria-label': 'Position', 'aria-valuetext': '0:00', disabled: true,
  });
  const time = h('span', { id: 'time', class: 'time', text: '0:00.0 / —' });
  const speed = h('select', { id: 'speed', 'aria-keyshortcuts': '< >' },
    SPEEDS.map((v) => h('option', { value: String(v), selected: v === 1, text: `${v}×` })));
  const idle = h('input', { type: 'checkbox', id: 'idle', checked: true, 'aria-keyshortcuts': 'i' });
  const status = h('p', { id: 'player-status', class: 'status', role: 'status', 'aria-live': 'polite' });
  show(title,
    h('h1', { text: title }),
    about,
    h('div', { class: 'controls', role: 'group', 'aria-label': 'Playback' },
      playBtn,
      h('label', { for: 'seek', class: 'visually-hidden', text: 'Position' }), seek, time,
      h('label', { for: 'speed', text: 'Speed' }), speed,
      h('label', { class: 'check' }, idle, ` Skip idle time (pauses over ${IDLE_LIMIT} s)`),
      download),
    status,
    box,
    h('details', { class: 'shortcuts' },
      h('summary', { text: 'Keyboard shortcuts' }),
      h('ul', {},
        h('li', { text: 'Space or k: play / pause' }),
        h('li', { text: '← / →: back / forward 5 s' }),
        h('li', { text: 'Home / End: the start / the end' }),
        h('li', { text: '< / >: slower / faster' }),
        h('li', { text: 'i: skip idle time on or off' }),
        h('li', { text: 'f: full screen (when the player has focus)' }))),
    back);

  try {
    await loadPlayer();
  } catch (e) {
    status.classList.add('error');
    status.textContent = e.message;
    return;
  }

  let player = null;
  let playing = false;
  let length = 0;
  const setPlaying = (p) => {
    playing = p;
    playBtn.textContent = p ? 'Pause' : 'Play';
    box.dataset.state = p ? 'playing' : 'paused';
  };
  const refresh = async () => {
    if (!player) return;
    const now = (await player.getCurrentTime()) || 0;
    if (document.activeElement !== seek) seek.value = String(now);
    seek.setAttribute('aria-valuetext', clock(now));
    time.textContent = `${position(now)} / ${position(length)}`;
    box.dataset.time = String(now);
  };

  /** A new player at `fraction` of the recording (0..1), with the chosen speed and idle skip. */
  const create = async (fraction, resume) => {
    if (player) player.dispose();
    box.replaceChildren();
    box.dataset.state = 'loading';
    seek.disabled = true;
    player = globalThis.AsciinemaPlayer.create(castPath(id), box, {
      preload: true,
      autoPlay: false,
      controls: false,
      fit: 'width',
      speed: Number(speed.value),
      idleTimeLimit: idle.checked ? IDLE_LIMIT : undefined,
      terminalFontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
    });
    const p = player;
    p.addEventListener('play', () => { if (p === player) setPlaying(true); });
    p.addEventListener('playing', () => { if (p === player) setPlaying(true); });
    p.addEventListener('pause', () => { if (p === player) setPlaying(false); });
    p.addEventListener('ended', () => { if (p === player) { setPlaying(false); box.dataset.state = 'ended'; refresh(); } });
    // Wait for the cast (preload) to know its length.
    for (let i = 0; i < 600 && p === player; i += 1) {
      const dur = await p.getDuration();
      if (Number.isFinite(dur) && dur > 0) { length = dur; break; }
      await new Promise((r) => setTimeout(r, 50));
    }
    if (p !== player) return;
    seek.max = String(length);
    seek.disabled = false;
    box.dataset.duration = String(length);
    if (fraction > 0) await p.seek(fraction >= 1 ? length : fraction * length);
    setPlaying(false);
    box.dataset.state = 'ready';
    if (resume) await p.play();
    status.textContent = '';
    refresh();
  };
  const remake = async () => {
    const now = (await player.getCurrentTime()) || 0;
    await create(length ? now / length : 0, playing);
  };
  const toggle = async () => { if (playing) await player.pause(); else await player.play(); };
  const seekTo = async (t) => {
    const to = Math.max(0, Math.min(length, t));
    await player.seek(to);
    if (to >= length) box.dataset.state = 'ended';
    refresh();
  };
  const faster = (by) => {
    const i = SPEEDS.indexOf(Number(speed.value)) + by;
    if (i < 0 || i >= SPEEDS.length) return;
    speed.value = String(SPEEDS[i]);
    status.textContent = `Speed ${SPEEDS[i]}×`;
    remake();
  };

  playBtn.addEventListener('click', toggle);
  seek.addEventListener('change', () => seekTo(Number(seek.value)));
  speed.addEventListener('change', () => remake());
  idle.addEventListener('change', () => {
    status.textContent = idle.checked ? 'Idle time skipped' : 'Idle time played';
    remake();
  });
  const keys = {
    ' ': () => toggle(),
    k: () => toggle(),
    ArrowLeft: async () => seekTo(((await player.getCurrentTime()) || 0) - 5),
    ArrowRight: async () => seekTo(((await player.getCurrentTime()) || 0) + 5),
    Home: () => seekTo(0),
    End: () => seekTo(length),
    '<': () => faster(-1),
    '>': () => faster(1),
    i: () => { idle.checked = !idle.checked; idle.dispatchEvent(new Event('change')); },
  };
  document.addEventListener('keydown', (e) => {
    if (!player || e.ctrlKey || e.metaKey || e.altKey || !keys[e.key]) return;
    const t = e.target;
    // Form controls keep their own keys; the player keeps its own (arrows, space, f) when focused.
    if (t.closest && (t.closest('input, select, textarea, button, a, summary') || t.closest('#player'))) return;
    e.preventDefault();
    keys[e.key]();
  });
  setInterval(refresh, 250);
  await create(0, false);
}
