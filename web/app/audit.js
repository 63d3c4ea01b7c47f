// /web/audit: the audit log, newest first, a page at a time (the API's next_cursor), filtered
// by type, user, node, session and a time range. The filters live in the address (so a search
// can be bookmarked and shared), and "Download JSON" links the download endpoint with the same
// filters: every match, oldest first, as `sallyctl audit search` prints it.
//
// Every field of a record is untrusted (user names, hostnames, commands, SSO claims): shown as
// text only.

import { h, show } from './dom.js';
import { api } from './api.js';
import { go } from './main.js';

const FIELDS = ['type', 'user', 'node', 'session'];
const TIMES = ['since', 'until'];
const PAGE = 50;
/** The page size: `?limit=N` in the address (1–1000), else PAGE. */
function pageSize(params) {
  const n = Number(params.get('limit'));
  return Number.isInteger(n) && n >= 1 && n <= 1000 ? n : PAGE;
}

/** `datetime-local` text (the browser's time zone) → Unix seconds, or '' when empty. */
export function unixSeconds(local) {
  if (!local) return '';
  const t = Date.parse(local);
  return Number.isNaN(t) ? '' : String(Math.floor(t / 1000));
}

/** Unix seconds → `datetime-local` text in the browser's time zone. */
export function localText(secs) {
  const n = Number(secs);
  if (!secs || !Number.isFinite(n)) return '';
  const d = new Date(n * 1000);
  const p = (x) => String(x).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}

/** The API's query for `filters` ({type, user, node, session, since, until}, times in seconds). */
export function query(filters) {
  const q = new URLSearchParams();
  for (const k of [...FIELDS, ...TIMES]) if (filters[k]) q.set(k, filters[k]);
  return q;
}

/** The fields a row shows in columns of their own; the rest go in Details. */
const SHOWN = new Set(['event', 'time', 'user', 'node', 'session_id', 'seq', 'hash', 'prev_hash', 'uid', 'v', 'cluster_name']);

function details(r) {
  const rest = {};
  for (const [k, v] of Object.entries(r)) if (!SHOWN.has(k)) rest[k] = v;
  return Object.keys(rest).length ? JSON.stringify(rest) : '';
}

function row(r) {
  const t = new Date(r.time);
  return h('tr', { 'data-seq': r.seq },
    h('td', {}, h('time', { datetime: String(r.time), text: Number.isNaN(t.getTime()) ? String(r.time) : t.toLocaleString() })),
    h('th', { scope: 'row', text: String(r.event) }),
    h('td', { text: r.user ?? '' }),
    h('td', { text: r.node ?? r.server_hostname ?? '' }),
    h('td', { text: r.session_id ? String(r.session_id).slice(0, 8) : '', title: r.session_id ?? undefined }),
    h('td', {}, h('code', { text: details(r) })));
}

export async function render() {
  const params = new URLSearchParams(location.search);
  const filters = {};
  for (const k of [...FIELDS, ...TIMES]) filters[k] = params.get(k) || '';
  const size = pageSize(params);

  const input = (id, label, attrs) => h('div', { class: 'field' },
    h('label', { for: `f-${id}`, text: label }),
    h('input', { id: `f-${id}`, name: id, autocomplete: 'off', spellcheck: 'false', 'aria-describedby': 'audit-status', ...attrs }));
  const form = h('form', { class: 'filters', id: 'audit-filters', role: 'search', 'aria-label': 'Filter the audit log' },
    input('type', 'Event type', { value: filters.type, placeholder: 'user.login', list: 'event-types' }),
    input('user', 'User', { value: filters.user }),
    input('node', 'Server', { value: filters.node }),
    input('session', 'Session', { value: filters.session }),
    input('since', 'Since', { type: 'datetime-local', value: localText(filters.since) }),
    input('until', 'Until', { type: 'datetime-local', value: localText(filters.until) }),
    h('button', { type: 'submit', text: 'Search' }),
    h('button', { type: 'button', class: 'secondary', id: 'audit-clear', text: 'Clear' }));
  const types = h('datalist', { id: 'event-types' },
    ['user.login', 'session.start', 'session.end', 'session.rejected', 'exec', 'role.created', 'role.deleted', 'lock.created', 'lock.deleted']
      .map((t) => h('option', { value: t })));
  const status = h('p', { id: 'audit-status', class: 'status', role: 'status', 'aria-live': 'polite', text: 'Loading…' });
  const download = h('a', { class: 'button', id: 'audit-download', download: 'audit.ndjson', text: 'Download JSON' });
  const tbody = h('tbody');
  const anchored = h('p', { id: 'audit-unanchored', class: 'muted', hidden: true });
  const more = h('button', { type: 'button', id: 'audit-more', text: 'Older events', hidden: true });
  show('Audit log',
    h('h1', { text: 'Audit log' }),
    form, types,
    h('div', { class: 'actions' }, download,
      h('small', { class: 'muted', text: 'Every matching event, oldest first, one JSON object a line (as sallyctl audit search prints).' })),
    status, anchored,
    h('table', { class: 'grid', id: 'audit' },
      h('caption', { class: 'visually-hidden', text: 'Audit events, newest first' }),
      h('thead', {}, h('tr', {},
        ['Time', 'Event', 'User', 'Server', 'Session', 'Details'].map((t) => h('th', { scope: 'col', text: t })))),
      tbody),
    h('div', { class: 'actions' }, more));

  const q = query(filters);
  download.href = `/v1/webapi/audit/download${q.toString() ? `?${q}` : ''}`;

  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const next = {};
    for (const k of FIELDS) next[k] = form.elements[k].value.trim();
    for (const k of TIMES) next[k] = unixSeconds(form.elements[k].value);
    const q2 = query(next);
    if (params.has('limit')) q2.set('limit', String(size));
    const s = q2.toString();
    go(`/web/audit${s ? `?${s}` : ''}`);
  });
  document.getElementById('audit-clear').addEventListener('click', () => go('/web/audit'));

  let cursor = null;
  let shown = 0;
  const load = async () => {
    const p = query(filters);
    p.set('limit', String(size));
    if (cursor) p.set('cursor', String(cursor));
    more.disabled = true;
    let page;
    try {
      page = await api('GET', `/v1/webapi/audit?${p}`);
    } catch (e) {
      if (e.status === 401) { go(`/web/login?next=${encodeURIComponent(location.pathname + location.search)}`, true); return; }
      status.classList.add('error');
      status.textContent = `Cannot search the audit log: ${e.message}`;
      more.disabled = false;
      return;
    }
    status.classList.remove('error');
    tbody.parentElement.dataset.loaded = query(filters).toString();
    tbody.append(...page.events.map(row));
    shown += page.events.length;
    cursor = page.next_cursor;
    more.hidden = !cursor;
    more.disabled = false;
    status.textContent = shown === 0 ? 'No events match.' : `${shown} events shown${cursor ? ', older ones below' : ''}.`;
    if (page.unanchored_from) {
      anchored.hidden = false;
      anchored.textContent = `Events from number ${page.unanchored_from} on are not yet covered by a signed checkpoint: they link to the chain, but could still be rewritten by whoever writes to the database until auth signs one (within a minute or so).`;
    }
  };
  more.addEventListener('click', load);
  await load();
}
