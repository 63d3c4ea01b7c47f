// The web UI's entry: a small router over history.pushState. Every page path is this one
// index.html (the proxy serves it for all of /web/*); each page is a module loaded when first
// shown, so the sign-in page never downloads the terminal.

import { h, show } from './dom.js';
import { current, loadSession, signOut } from './api.js';

// The player is the one page that runs WASM (asciinema-player's terminal): the proxy adds
// 'wasm-unsafe-eval' to the CSP of that path only, so it is always a document of its own —
// reached by a full load, and left by one — never a pushState from or to another page.
const PLAYER = /^\/web\/recordings\/([^/]+)$/;
const onPlayer = PLAYER.test(location.pathname);

const routes = [
  { re: /^\/web\/?$/, open: true, page: () => go(current() ? '/web/nodes' : '/web/login', true) },
  { re: /^\/web\/login$/, open: true, page: async () => (await import('./login.js')).render() },
  { re: /^\/web\/signup$/, open: true, page: async () => (await import('./signup.js')).render() },
  { re: /^\/web\/nodes$/, page: async () => (await import('./nodes.js')).render() },
  { re: /^\/web\/recordings$/, page: async () => (await import('./recordings.js')).renderList() },
  {
    re: PLAYER,
    page: async (m) => (await import('./recordings.js')).renderPlayer(decodeURIComponent(m[1])),
  },
  { re: /^\/web\/audit$/, page: async () => (await import('./audit.js')).render() },
  { re: /^\/web\/admin\/roles$/, page: async () => (await import('./roles.js')).renderList() },
  {
    re: /^\/web\/admin\/roles\/([^/]+)$/,
    page: async (m) => (await import('./roles.js')).renderEditor(decodeURIComponent(m[1])),
  },
  { re: /^\/web\/admin\/users$/, page: async () => (await import('./users.js')).render() },
  { re: /^\/web\/admin\/tokens$/, page: async () => (await import('./tokens.js')).render() },
  {
    re: /^\/web\/nodes\/([^/]+)\/terminal$/,
    page: async (m) => (await import('./terminal.js')).render(decodeURIComponent(m[1]),
      new URLSearchParams(location.search).get('login') || ''),
  },
];

let leaving = null;

/** Called by a page that holds something to close (a terminal) when another page replaces it. */
export function onLeave(fn) { leaving = fn; }

export function go(path, replace = false) {
  if (onPlayer || PLAYER.test(new URL(path, location.href).pathname)) {
    if (replace) location.replace(path);
    else location.assign(path);
    return Promise.resolve();
  }
  if (replace) history.replaceState(null, '', path);
  else history.pushState(null, '', path);
  return route();
}

async function route() {
  if (leaving) {
    const fn = leaving;
    leaving = null;
    try { fn(); } catch (e) { /* the page is going anyway */ }
  }
  const path = location.pathname;
  for (const r of routes) {
    const m = path.match(r.re);
    if (!m) continue;
    if (!r.open && !current()) {
      const next = path + location.search;
      return go(`/web/login?next=${encodeURIComponent(next)}`, true);
    }
    bar();
    return r.page(m);
  }
  bar();
  show('Not found',
    h('h1', { text: 'Page not found' }),
    h('p', {}, 'There is no page at ', h('code', { text: path }), '.'),
    h('p', {}, h('a', { href: '/web/nodes', text: 'Go to the servers' })));
}

function bar() {
  const s = current();
  document.getElementById('bar').hidden = !s;
  document.getElementById('who').textContent = s ? `Signed in as ${s.user}` : '';
  if (s) navigation();
  const here = location.pathname;
  for (const a of document.querySelectorAll('#bar nav a')) {
    const at = a.getAttribute('href');
    if (here === at || here.startsWith(`${at}/`)) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

// The header's links to the pages the user's roles can use. Auth decides with the current
// roles, and the proxy only knows the roles' names, so the page asks: one small read per
// page (a 403 hides its link). Asked once per document, for the user signed in then.
let navigated = null;
function navigation() {
  const s = current();
  if (navigated === s.user) return;
  navigated = s.user;
  const probes = {
    'nav-audit': '/v1/webapi/audit?limit=1',
    'nav-roles': '/v1/webapi/roles',
    'nav-users': '/v1/webapi/users',
    'nav-tokens': '/v1/webapi/tokens',
  };
  const bar = document.getElementById('bar');
  delete bar.dataset.nav;
  Promise.allSettled(Object.entries(probes).map(([id, path]) =>
    fetch(path, { headers: { Accept: 'application/json' }, credentials: 'same-origin', cache: 'no-store' })
      .then(async (r) => {
        document.getElementById(id).hidden = !r.ok;
        // Read to the end: an unread answer stays open (the page never goes network-idle).
        await r.arrayBuffer();
      })))
    .then(() => { bar.dataset.nav = 'ready'; });
}

// Same-origin links under /web/ stay in the page (but the player, which needs its own CSP,
// and clicks with a modifier, which open tabs).
document.addEventListener('click', (e) => {
  const a = e.target.closest && e.target.closest('a[href]');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || !url.pathname.startsWith('/web') || a.target) return;
  if (onPlayer || PLAYER.test(url.pathname)) return;
  // A link within this page (the skip link's #main): the browser's own, no new page (a route
  // would end a live terminal, or read the sign-up token from the hash again).
  if (url.pathname === location.pathname && url.search === location.search && url.hash) return;
  e.preventDefault();
  go(url.pathname + url.search + url.hash);
});
window.addEventListener('popstate', () => route());

document.getElementById('signout').addEventListener('click', async () => {
  try { await signOut(); } catch (e) { /* signed out here either way */ }
  go('/web/login');
});

async function start() {
  try {
    await loadSession();
  } catch (e) {
    show('Error', h('h1', { text: 'The proxy cannot be reached' }),
      h('p', { role: 'alert', text: e.message }));
    return;
  }
  await route();
}

start();
