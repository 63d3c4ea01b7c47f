// /web/admin/users: the users (local or SSO, roles, locked) as auth lets the admin see them;
// add one (its sign-up link shown once: only its hash is kept); reset one (a new link, the old
// password and authenticator gone); lock one (a message and a time to live; their sessions and
// terminals end within the proxy's 2 s poll); lift a lock. Names, roles and messages are
// untrusted text.

import { h, show } from './dom.js';
import { api } from './api.js';
import { go } from './main.js';

const list = (s) => s.split(/[\s,]+/).map((x) => x.trim()).filter(Boolean);

function when(t) {
  if (!t) return 'never';
  const d = new Date(typeof t === 'number' ? t * 1000 : t);
  return Number.isNaN(d.getTime()) ? String(t) : d.toLocaleString();
}

/** A secret shown once: the link or command, and a note that it is not shown again. */
export function once(id, what, text, expires) {
  return h('div', { class: 'once', id, role: 'alert' },
    h('p', { text: `${what} — shown once, copy it now${expires ? ` (it works until ${when(expires)})` : ''}:` }),
    h('pre', {}, h('code', { text })));
}

export async function render() {
  const status = h('p', { id: 'users-status', class: 'status', role: 'status', 'aria-live': 'polite', text: 'Loading…' });
  const result = h('div', { id: 'users-result', 'aria-live': 'polite' });
  const tbody = h('tbody');
  const field = (id, label, attrs = {}, help) => h('div', { class: 'field' },
    h('label', { for: id, text: label }),
    h('input', { id, name: id, autocomplete: 'off', spellcheck: 'false', 'aria-describedby': help ? `${id}-help` : undefined, ...attrs }),
    help ? h('small', { id: `${id}-help`, text: help }) : null);
  const add = h('form', { class: 'filters', id: 'add-user', 'aria-label': 'Add a user' },
    field('user-name', 'Name', { required: true }),
    field('user-roles', 'Roles', { required: true }, 'Comma separated, e.g. access, auditor'),
    field('user-logins', 'Logins', {}, 'Comma separated, e.g. root, ubuntu'),
    h('button', { type: 'submit', text: 'Add user' }));
  show('Users',
    h('h1', { text: 'Users' }),
    status, result,
    h('table', { class: 'grid', id: 'users' },
      h('caption', { class: 'visually-hidden', text: 'Users' }),
      h('thead', {}, h('tr', {}, ['Name', 'Type', 'Roles', 'Logins', 'Status', 'Actions'].map((t) => h('th', { scope: 'col', text: t })))),
      tbody),
    h('h2', { text: 'Add a user' }),
    add);

  const fail = (what, e) => {
    if (e.status === 401) { go('/web/login?next=/web/admin/users', true); return; }
    result.replaceChildren(h('p', { class: 'error', role: 'alert', text: `${what}: ${e.message}` }));
  };

  const lockForm = (u) => {
    const id = `lock-${u.name.replace(/[^A-Za-z0-9_-]/g, '_')}`;
    const form = h('form', { class: 'filters', 'aria-label': `Lock ${u.name}` },
      h('div', { class: 'field' }, h('label', { for: `${id}-message`, text: 'Message' }),
        h('input', { id: `${id}-message`, name: 'message', autocomplete: 'off' })),
      h('div', { class: 'field' }, h('label', { for: `${id}-ttl`, text: 'For' }),
        h('input', { id: `${id}-ttl`, name: 'ttl', size: '6', autocomplete: 'off', placeholder: '1h', 'aria-describedby': `${id}-ttl-help` }),
        h('small', { id: `${id}-ttl-help`, text: 'e.g. 30m, 8h; empty: until unlocked' })),
      h('button', { type: 'submit', text: 'Lock', 'aria-label': `Lock ${u.name}` }));
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      const body = { user: u.name };
      if (form.elements.message.value.trim()) body.message = form.elements.message.value.trim();
      if (form.elements.ttl.value.trim()) body.ttl = form.elements.ttl.value.trim();
      try {
        await api('POST', '/v1/webapi/locks', body);
        result.replaceChildren(h('p', { class: 'ok', text: `${u.name} is locked out; their sessions end within seconds.` }));
        await load();
      } catch (err) { fail(`Cannot lock ${u.name}`, err); }
    });
    return form;
  };

  const row = (u) => {
    const locks = u.locks || [];
    const actions = h('div', { class: 'actions' });
    actions.append(h('button', {
      type: 'button', class: 'secondary', text: 'Reset', 'aria-label': `Reset ${u.name}'s password and authenticator`,
      onclick: async () => {
        // eslint-disable-next-line no-alert
        if (!window.confirm(`Reset ${u.name}? Their password and authenticator stop working; they sign up again from a new link.`)) return;
        try {
          const r = await api('POST', `/v1/webapi/users/${encodeURIComponent(u.name)}/reset`);
          result.replaceChildren(once('signup-link', `The sign-up link for ${r.user}`, r.signup_url, r.expires));
        } catch (err) { fail(`Cannot reset ${u.name}`, err); }
      },
    }));
    for (const l of locks) {
      actions.append(h('button', {
        type: 'button', class: 'secondary', text: 'Unlock', 'aria-label': `Unlock ${u.name}${l.message ? ` (${l.message})` : ''}`,
        onclick: async () => {
          try {
            await api('DELETE', `/v1/webapi/locks/${encodeURIComponent(l.id)}`);
            result.replaceChildren(h('p', { class: 'ok', text: `A lock on ${u.name} is lifted.` }));
            await load();
          } catch (err) { fail(`Cannot unlock ${u.name}`, err); }
        },
      }));
    }
    actions.append(lockForm(u));
    const state = u.locked
      ? h('span', { class: 'status-offline' }, 'locked',
        ...locks.map((l) => h('small', { class: 'muted', text: ` ${l.message ? `“${l.message}” ` : ''}until ${when(l.expires)}` })))
      : h('span', { text: u.status || 'active' });
    return h('tr', { 'data-user': u.name },
      h('th', { scope: 'row', text: u.name }),
      h('td', { text: u.type || '' }),
      h('td', { text: (u.roles || []).join(', ') }),
      h('td', { text: (u.logins || []).join(', ') }),
      h('td', {}, state),
      h('td', {}, actions));
  };

  const load = async () => {
    let users;
    try {
      users = await api('GET', '/v1/webapi/users');
    } catch (e) {
      if (e.status === 401) { go('/web/login?next=/web/admin/users', true); return; }
      status.classList.add('error');
      status.textContent = `Cannot list the users: ${e.message}`;
      return;
    }
    tbody.replaceChildren(...users.map(row));
    status.textContent = `${users.length} users.`;
  };

  add.addEventListener('submit', async (e) => {
    e.preventDefault();
    const body = {
      name: add.elements['user-name'].value.trim(),
      roles: list(add.elements['user-roles'].value),
      logins: list(add.elements['user-logins'].value),
    };
    try {
      const r = await api('POST', '/v1/webapi/users', body);
      result.replaceChildren(once('signup-link', `The sign-up link for ${r.user}`, r.signup_url, r.expires));
      add.reset();
      await load();
    } catch (err) { fail(`Cannot add ${body.name}`, err); }
  });
  await load();
}
