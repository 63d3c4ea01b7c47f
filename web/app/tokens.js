// /web/admin/tokens: the join tokens an agent could still join with (auth keeps only their
// hashes, so the list never holds a secret), and a new one: the `sallyport start` command an
// agent runs, shown once.

import { h, show } from './dom.js';
import { api } from './api.js';
import { go } from './main.js';
import { once } from './users.js';

function when(t) {
  const d = new Date(typeof t === 'number' ? t * 1000 : t);
  return Number.isNaN(d.getTime()) ? String(t) : d.toLocaleString();
}

export async function render() {
  const status = h('p', { id: 'tokens-status', class: 'status', role: 'status', 'aria-live': 'polite', text: 'Loading…' });
  const result = h('div', { id: 'tokens-result', 'aria-live': 'polite' });
  const tbody = h('tbody');
  const add = h('form', { class: 'filters', id: 'add-token', 'aria-label': 'Add a join token' },
    h('div', { class: 'field' }, h('label', { for: 'token-type', text: 'For' }),
      h('select', { id: 'token-type', name: 'type' },
        h('option', { value: 'node', text: 'a server (node agent)' }),
        h('option', { value: 'kube', text: 'a Kubernetes cluster (kube agent)' }))),
    h('div', { class: 'field' }, h('label', { for: 'token-ttl', text: 'Valid for' }),
      h('input', { id: 'token-ttl', name: 'ttl', size: '6', placeholder: '30m', autocomplete: 'off', 'aria-describedby': 'token-ttl-help' }),
      h('small', { id: 'token-ttl-help', text: 'e.g. 30m, 2h; 30m when empty' })),
    h('button', { type: 'submit', text: 'Add token' }));
  show('Join tokens',
    h('h1', { text: 'Join tokens' }),
    status, result,
    h('table', { class: 'grid', id: 'tokens' },
      h('caption', { class: 'visually-hidden', text: 'Join tokens not used yet' }),
      h('thead', {}, h('tr', {}, ['Type', 'Made by', 'Expires'].map((t) => h('th', { scope: 'col', text: t })))),
      tbody),
    h('h2', { text: 'Add a join token' }),
    add);

  const load = async () => {
    let tokens;
    try {
      tokens = await api('GET', '/v1/webapi/tokens');
    } catch (e) {
      if (e.status === 401) { go('/web/login?next=/web/admin/tokens', true); return; }
      status.classList.add('error');
      status.textContent = `Cannot list the join tokens: ${e.message}`;
      return;
    }
    tbody.replaceChildren(...tokens.map((t) => h('tr', {},
      h('th', { scope: 'row', text: String(t.type) }),
      h('td', { text: t.user || '' }),
      h('td', { text: when(t.expires) }))));
    status.textContent = tokens.length ? `${tokens.length} tokens not used yet.` : 'No join tokens waiting.';
  };
  add.addEventListener('submit', async (e) => {
    e.preventDefault();
    const body = { type: add.elements.type.value };
    if (add.elements.ttl.value.trim()) body.ttl = add.elements.ttl.value.trim();
    try {
      const r = await api('POST', '/v1/webapi/tokens', body);
      result.replaceChildren(once('agent-command', `The command to start a ${r.type} agent with`, r.command, r.expires));
      await load();
    } catch (err) {
      if (err.status === 401) { go('/web/login?next=/web/admin/tokens', true); return; }
      result.replaceChildren(h('p', { class: 'error', role: 'alert', text: `Cannot add a token: ${err.message}` }));
    }
  });
  await load();
}
