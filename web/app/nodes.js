// /web/nodes: the nodes the roles reach (the proxy asks auth as the web session), a search by
// name or key=value, and per node a chooser of only the logins the roles allow there.

import { h, show } from './dom.js';
import { api } from './api.js';
import { go } from './main.js';

/** Whether `node` matches every word of `query`: `key=value` a label exactly, else part of the name. */
export function matches(node, query) {
  return query.split(/\s+/).filter(Boolean).every((word) => {
    const eq = word.indexOf('=');
    if (eq > 0) return node.labels[word.slice(0, eq)] === word.slice(eq + 1);
    return node.name.toLowerCase().includes(word.toLowerCase());
  });
}

export function terminalPath(node, login) {
  return `/web/nodes/${encodeURIComponent(node)}/terminal?login=${encodeURIComponent(login)}`;
}

export async function render() {
  const q = new URLSearchParams(location.search).get('q') || '';
  const status = h('p', { id: 'nodes-status', class: 'status', role: 'status', 'aria-live': 'polite' });
  const search = h('input', {
    id: 'search', type: 'search', value: q, autocomplete: 'off', spellcheck: 'false',
    'aria-describedby': 'search-help nodes-status',
  });
  const tbody = h('tbody');
  const table = h('table', { class: 'nodes' },
    h('caption', { class: 'visually-hidden', text: 'Servers you may reach' }),
    h('thead', {}, h('tr', {},
      ['Name', 'Labels', 'Status', 'Connect'].map((t) => h('th', { scope: 'col', text: t })))),
    tbody);
  show('Servers',
    h('h1', { text: 'Servers' }),
    h('div', { class: 'field search' },
      h('label', { for: 'search', text: 'Search' }),
      search,
      h('small', { id: 'search-help', text: 'By name, or key=value for a label; several words all match.' })),
    status, table);

  let nodes = [];
  try {
    nodes = await api('GET', '/v1/webapi/nodes');
  } catch (e) {
    if (e.status === 401) return go('/web/login?next=/web/nodes', true);
    status.classList.add('error');
    status.textContent = `Cannot list the servers: ${e.message}`;
    return;
  }

  const rows = nodes.map((n) => ({ node: n, row: row(n) }));
  const filter = () => {
    const query = search.value.trim();
    let shown = 0;
    for (const { node, row: tr } of rows) {
      tr.hidden = !matches(node, query);
      if (!tr.hidden) shown += 1;
    }
    status.textContent = nodes.length === 0
      ? 'No servers: your roles reach none yet.'
      : `${shown} of ${nodes.length} servers shown.`;
    const url = query ? `/web/nodes?q=${encodeURIComponent(query)}` : '/web/nodes';
    history.replaceState(null, '', url);
  };
  tbody.replaceChildren(...rows.map((r) => r.row));
  search.addEventListener('input', filter);
  filter();
}

function row(n) {
  const labels = h('ul', { class: 'labels' },
    Object.entries(n.labels || {}).map(([k, v]) => h('li', { text: `${k}=${v}` })));
  let connect;
  if (!n.logins || n.logins.length === 0) {
    connect = h('span', { class: 'muted', text: 'no login allowed' });
  } else {
    const id = `login-${Math.random().toString(36).slice(2)}`;
    const select = h('select', { id, 'aria-label': `Login on ${n.name}` },
      n.logins.map((l) => h('option', { value: l, text: l })));
    const button = h('button', {
      type: 'button', text: 'Connect', 'aria-label': `Connect to ${n.name}`,
      onclick: () => go(terminalPath(n.name, select.value)),
    });
    connect = h('div', { class: 'connect' }, select, button);
  }
  return h('tr', { 'data-node': n.name },
    h('th', { scope: 'row', text: n.name }),
    h('td', {}, labels),
    h('td', {}, h('span', { class: `status-${n.status === 'online' ? 'online' : 'offline'}`, text: n.status })),
    h('td', {}, connect));
}
