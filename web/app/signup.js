// /web/signup#TOKEN: a new user sets a password and, when the cluster asks for one, enrolls an
// authenticator (QR code drawn by the proxy, the secret as text for typing in) and proves it
// with a first code. The token travels in the fragment, which no request, log or Referer
// carries; the page takes it out of the address bar (and history) as soon as it has read it.

import { h, show } from './dom.js';
import { api } from './api.js';

export async function render() {
  const token = location.hash.slice(1);
  if (token) history.replaceState(null, '', '/web/signup');
  const error = h('p', { id: 'signup-error', class: 'error', role: 'alert', 'aria-live': 'assertive' });
  if (!token) {
    show('Sign up', h('section', { class: 'login' }, h('h1', { text: 'Set up your account' }),
      h('p', { role: 'alert', class: 'error', text: 'Open the sign-up link your administrator gave you (the page keeps it only until it is used or reloaded).' })));
    return;
  }
  show('Sign up', h('section', { class: 'login' }, h('h1', { text: 'Set up your account' }), h('p', { class: 'status', text: 'Checking the link…' })));
  let started;
  try {
    started = await api('POST', '/v1/webapi/signup/start', { token });
  } catch (e) {
    show('Sign up', h('section', { class: 'login' }, h('h1', { text: 'Set up your account' }),
      h('p', { role: 'alert', class: 'error', text: `This sign-up link cannot be used: ${e.message}` })));
    return;
  }
  const field = (id, label, attrs, ...after) => h('div', { class: 'field' },
    h('label', { for: id, text: label }),
    h('input', { id, name: id, 'aria-describedby': 'signup-error', ...attrs }), ...after);
  const totp = [];
  if (started.otpauth_uri) {
    let secret = '';
    try { secret = new URL(started.otpauth_uri).searchParams.get('secret') || ''; } catch (e) { secret = ''; }
    totp.push(h('fieldset', { class: 'totp' },
      h('legend', { text: 'Authenticator app' }),
      h('p', { text: 'Scan this code with your authenticator app, or type the key below into it.' }),
      started.otpauth_qr_svg
        ? h('img', { id: 'totp-qr', width: '200', height: '200', alt: 'QR code to add this account to an authenticator app',
          src: `data:image/svg+xml,${encodeURIComponent(started.otpauth_qr_svg)}` })
        : null,
      h('p', {}, 'Key: ', h('code', { id: 'totp-secret', text: secret.replace(/(.{4})/g, '$1 ').trim() })),
      field('code', 'Code from your authenticator', { inputmode: 'numeric', autocomplete: 'one-time-code', required: true, maxlength: '10' })));
  }
  const form = h('form', { class: 'card', novalidate: true },
    field('user', 'User', { autocomplete: 'username', readonly: true, value: started.user }),
    field('password', 'New password', { type: 'password', autocomplete: 'new-password', required: true }),
    field('repeat', 'Repeat the password', { type: 'password', autocomplete: 'new-password', required: true }),
    ...totp,
    error,
    h('button', { type: 'submit', text: 'Create account' }));
  show('Sign up', h('section', { class: 'login' }, h('h1', { text: `Set up your account, ${started.user}` }), form));
  const input = (id) => form.querySelector(`#${id}`);
  input('password').focus();

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    for (const el of form.querySelectorAll('input')) el.removeAttribute('aria-invalid');
    const bad = (id, message) => {
      error.textContent = message;
      input(id).setAttribute('aria-invalid', 'true');
      input(id).focus();
    };
    const password = input('password').value;
    if (!password) return bad('password', 'Choose a password.');
    if (password !== input('repeat').value) return bad('repeat', 'The two passwords differ.');
    const code = input('code') ? input('code').value.trim() : undefined;
    if (input('code') && !code) return bad('code', 'Enter the code your authenticator shows.');
    const button = form.querySelector('button');
    button.disabled = true;
    error.textContent = '';
    try {
      await api('POST', '/v1/webapi/signup/finish', { token, password, otp_code: code });
    } catch (err) {
      button.disabled = false;
      return bad(/code|otp/i.test(err.message) && input('code') ? 'code' : 'password', err.message);
    }
    show('Signed up', h('section', { class: 'login' }, h('h1', { text: 'Your account is ready' }),
      h('p', { role: 'status', text: `Signed up as ${started.user}.` }),
      h('p', {}, h('a', { href: '/web/login', text: 'Sign in' }))));
  });
}
