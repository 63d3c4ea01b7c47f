// /web/login: user, password and one-time code; the error announced and tied to the form.

import { h, show } from './dom.js';
import { api, signIn } from './api.js';
import { go } from './main.js';

export async function render() {
  const error = h('p', { id: 'login-error', class: 'error', role: 'alert', 'aria-live': 'assertive' });
  const field = (id, label, attrs) => h('div', { class: 'field' },
    h('label', { for: id, text: label }),
    h('input', { id, name: id, 'aria-describedby': 'login-error', ...attrs }));
  const form = h('form', { class: 'card', novalidate: true },
    field('user', 'User', { autocomplete: 'username', required: true, autocapitalize: 'none', spellcheck: 'false' }),
    field('password', 'Password', { type: 'password', autocomplete: 'current-password', required: true }),
    field('totp', 'One-time code (if your account has one)', {
      inputmode: 'numeric', autocomplete: 'one-time-code', pattern: '[0-9]*', maxlength: '10',
    }),
    error,
    h('button', { type: 'submit', text: 'Sign in' }));
  const connectors = h('div', { class: 'connectors' });
  show('Sign in', h('section', { class: 'login' }, h('h1', { text: 'Sign in to Sallyport' }), form, connectors));

  const input = (id) => form.querySelector(`#${id}`);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const user = input('user').value.trim();
    const password = input('password').value;
    const totp = input('totp').value.trim();
    for (const id of ['user', 'password', 'totp']) input(id).removeAttribute('aria-invalid');
    if (!user || !password) {
      error.textContent = !user ? 'Enter your user name.' : 'Enter your password.';
      const bad = input(!user ? 'user' : 'password');
      bad.setAttribute('aria-invalid', 'true');
      bad.focus();
      return;
    }
    const button = form.querySelector('button');
    button.disabled = true;
    error.textContent = '';
    try {
      await signIn(user, password, totp || undefined);
      const next = new URLSearchParams(location.search).get('next');
      go(next && next.startsWith('/web/') && !next.startsWith('/web/login') ? next : '/web/nodes', true);
    } catch (err) {
      error.textContent = err.message;
      const bad = /code|otp|second factor/i.test(err.message) ? 'totp' : 'password';
      input(bad).setAttribute('aria-invalid', 'true');
      input(bad).focus();
    } finally {
      button.disabled = false;
    }
  });
  input('user').focus();

  // Single sign-on: one button per connector ping names, a plain link to the proxy's start of
  // the browser's OIDC sign-in (it comes back to /web/nodes signed in, or to a page saying why).
  try {
    const ping = await api('GET', '/v1/webapi/ping');
    const names = Array.isArray(ping.auth_connectors) ? ping.auth_connectors : [];
    if (names.length) {
      connectors.append(h('h2', { text: 'Single sign-on' }),
        h('ul', { class: 'sso' }, names.map((n) => h('li', {}, h('a', {
          class: 'button',
          href: `/v1/webapi/oidc/web/start?connector=${encodeURIComponent(n)}`,
          text: `Sign in with ${n}`,
        })))));
    }
  } catch (e) { /* sign-in works without it */ }
}
