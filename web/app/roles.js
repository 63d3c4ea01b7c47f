// /web/admin/roles: the roles (auth lists them to whom its `role` rules allow), and
// /web/admin/roles/{name}: one role's YAML in a plain textarea, checked by the proxy as it is
// typed (POST /v1/webapi/roles/validate, the reading `sallyctl create` does), each problem
// marked at its line and column, and saved only over the revision it was opened at (a 409
// says it changed since). `?new` opens an empty role of that name to create.

import { h, show } from './dom.js';
import { api } from './api.js';
import { go } from './main.js';

export function editorPath(name) { return `/web/admin/roles/${encodeURIComponent(name)}`; }
const apiPath = (name) => `/v1/webapi/roles/${encodeURIComponent(name)}`;

export function template(name) {
  return `kind: role
version: v1
metadata:
  name: ${name}
spec:
  allow:
    logins: []
    node_labels: {}
`;
}

/** The offset in `text` of 1-based `line` and `column`. */
export function offsetOf(text, line, column) {
  let at = 0;
  for (let l = 1; l < line; l += 1) {
    const nl = text.indexOf('\n', at);
    if (nl < 0) return text.length;
    at = nl + 1;
  }
  return Math.min(text.length, at + Math.max(0, column - 1));
}

function login(e) {
  if (e.status !== 401) return false;
  go(`/web/login?next=${encodeURIComponent(location.pathname + location.search)}`, true);
  return true;
}

export async function renderList() {
  const status = h('p', { id: 'roles-status', class: 'status', role: 'status', 'aria-live': 'polite', text: 'Loading…' });
  const tbody = h('tbody');
  const name = h('input', { id: 'new-role', name: 'name', required: true, autocomplete: 'off', spellcheck: 'false', pattern: '[A-Za-z0-9][A-Za-z0-9._-]*', 'aria-describedby': 'new-role-help' });
  const form = h('form', { class: 'filters', 'aria-label': 'New role' },
    h('div', { class: 'field' }, h('label', { for: 'new-role', text: 'New role name' }), name,
      h('small', { id: 'new-role-help', text: 'Letters, digits, dot, dash and underscore.' })),
    h('button', { type: 'submit', text: 'Create role' }));
  show('Roles',
    h('h1', { text: 'Roles' }),
    status,
    h('table', { class: 'grid', id: 'roles' },
      h('caption', { class: 'visually-hidden', text: 'Roles' }),
      h('thead', {}, h('tr', {}, ['Name', 'Description'].map((t) => h('th', { scope: 'col', text: t })))),
      tbody),
    h('h2', { text: 'Create a role' }),
    form);
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const n = name.value.trim();
    if (n) go(`${editorPath(n)}?new`);
  });
  let roles;
  try {
    roles = await api('GET', '/v1/webapi/roles');
  } catch (e) {
    if (login(e)) return;
    status.classList.add('error');
    status.textContent = `Cannot list the roles: ${e.message}`;
    return;
  }
  tbody.replaceChildren(...roles.map((r) => h('tr', { 'data-role': r.name },
    h('th', { scope: 'row' }, h('a', { href: editorPath(r.name), text: r.name })),
    h('td', { text: r.description || '' }))));
  status.textContent = `${roles.length} roles.`;
}

export async function renderEditor(name) {
  const creating = new URLSearchParams(location.search).has('new');
  const title = creating ? `New role ${name}` : `Role ${name}`;
  show(title, h('h1', { text: title }), h('p', { class: 'status', role: 'status', text: 'Loading…' }));
  let role = { name, yaml: template(name), revision: null };
  if (!creating) {
    try {
      role = await api('GET', apiPath(name));
    } catch (e) {
      if (login(e)) return;
      show(title, h('h1', { text: title }),
        h('p', { class: 'error', role: 'alert', text: `Cannot open role ${name}: ${e.message}` }),
        h('p', {}, h('a', { href: '/web/admin/roles', text: 'All roles' })));
      return;
    }
  }
  let revision = role.revision;

  const gutter = h('div', { class: 'gutter', 'aria-hidden': 'true' });
  const text = h('textarea', {
    id: 'role-yaml', name: 'yaml', spellcheck: 'false', autocapitalize: 'off', autocomplete: 'off',
    rows: '24', wrap: 'off', 'aria-describedby': 'role-errors-title role-errors',
  });
  text.value = role.yaml;
  const problems = h('ul', { class: 'problems', id: 'role-errors' });
  const problemsTitle = h('p', { id: 'role-errors-title', class: 'status', role: 'status', 'aria-live': 'polite' });
  const result = h('p', { id: 'role-result', role: 'alert', 'aria-live': 'assertive' });
  const save = h('button', { type: 'submit', id: 'role-save', text: creating ? 'Create' : 'Save' });
  const remove = creating ? null : h('button', { type: 'button', class: 'secondary', id: 'role-delete', text: 'Delete role' });
  const form = h('form', { id: 'role-form', 'aria-label': `Role ${name}` },
    h('div', { class: 'field' },
      h('label', { for: 'role-yaml', text: 'Role YAML' }),
      h('div', { class: 'editor' }, gutter, text)),
    problemsTitle, problems,
    h('div', { class: 'actions' }, save, remove, h('a', { href: '/web/admin/roles', text: 'All roles' })),
    result);
  show(title, h('h1', { text: title }), form);

  let bad = new Set();
  const drawGutter = () => {
    const lines = text.value.split('\n').length;
    const out = [];
    for (let i = 1; i <= lines; i += 1) {
      out.push(h('div', { class: bad.has(i) ? 'bad' : undefined, 'data-line': i, text: String(i) }));
    }
    gutter.replaceChildren(...out);
    gutter.scrollTop = text.scrollTop;
  };
  const goTo = (line, column) => {
    const at = offsetOf(text.value, line, column);
    text.focus();
    text.setSelectionRange(at, at);
  };
  const mark = (errors) => {
    bad = new Set(errors.map((e) => e.line));
    problems.replaceChildren(...errors.map((e) => h('li', { 'data-line': e.line, 'data-column': e.column },
      `Line ${e.line}, column ${e.column}: `, h('span', { class: 'message', text: e.message }),
      h('button', { type: 'button', text: 'Go there', 'aria-label': `Go there: line ${e.line}, column ${e.column}`, onclick: () => goTo(e.line, e.column) }))));
    problemsTitle.textContent = errors.length ? `${errors.length} problem${errors.length > 1 ? 's' : ''} in the YAML:` : 'The YAML is valid.';
    problemsTitle.classList.toggle('error', errors.length > 0);
    text.setAttribute('aria-invalid', errors.length ? 'true' : 'false');
    drawGutter();
  };

  let checking = 0;
  const check = async () => {
    const n = ++checking;
    try {
      const r = await api('POST', '/v1/webapi/roles/validate', { yaml: text.value });
      if (n === checking) mark(r.errors || []);
    } catch (e) {
      if (login(e)) return;
      if (n === checking) problemsTitle.textContent = `Cannot check the YAML: ${e.message}`;
    }
  };
  let timer = null;
  text.addEventListener('input', () => {
    drawGutter();
    clearTimeout(timer);
    timer = setTimeout(check, 400);
  });
  text.addEventListener('scroll', () => { gutter.scrollTop = text.scrollTop; });
  // Tab indents (YAML needs spaces); Escape then Tab leaves the field, as keyboard users expect.
  let escaped = false;
  text.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') { escaped = true; return; }
    if (e.key === 'Tab' && !e.shiftKey && !escaped) {
      e.preventDefault();
      text.setRangeText('  ', text.selectionStart, text.selectionEnd, 'end');
      text.dispatchEvent(new Event('input'));
    }
    escaped = false;
  });
  const help = h('small', { id: 'role-yaml-help', text: 'Tab indents by two spaces; press Escape, then Tab, to move on.' });
  text.parentElement.after(help);
  text.setAttribute('aria-describedby', `role-yaml-help ${text.getAttribute('aria-describedby')}`);

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    save.disabled = true;
    result.className = '';
    result.textContent = '';
    try {
      const body = { yaml: text.value };
      if (revision) body.revision = revision;
      const done = await api('PUT', apiPath(name), body);
      revision = done.revision;
      result.className = 'ok';
      result.textContent = done.created ? `Role ${name} created.` : `Role ${name} saved.`;
      mark([]);
      if (creating) {
        // From now on this page edits the role it made.
        history.replaceState(null, '', editorPath(name));
        save.textContent = 'Save';
      }
    } catch (err) {
      if (login(err)) return;
      result.className = 'error';
      if (err.status === 400 && err.body && Array.isArray(err.body.errors) && err.body.errors.length) {
        mark(err.body.errors);
        result.textContent = 'Not saved: the YAML has problems (listed above).';
      } else if (err.status === 409) {
        result.textContent = creating && !revision
          ? `Not saved: a role named ${name} already exists. Open it from the list to edit it.`
          : `Not saved: role ${name} changed since you opened it. Copy your changes, reload the page to see the current role, and apply them again.`;
      } else {
        result.textContent = `Not saved: ${err.message}`;
      }
    } finally {
      save.disabled = false;
    }
  });
  if (remove) {
    remove.addEventListener('click', async () => {
      // eslint-disable-next-line no-alert
      if (!window.confirm(`Delete role ${name}? Users holding it lose what it allows.`)) return;
      try {
        await api('DELETE', apiPath(name));
        go('/web/admin/roles');
      } catch (err) {
        if (login(err)) return;
        result.className = 'error';
        result.textContent = `Not deleted: ${err.message}`;
      }
    });
  }
  drawGutter();
  check();
}
