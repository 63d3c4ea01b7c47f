// Builds elements. Text goes in through textContent only: labels, hostnames, user names and
// error messages come from agents, SSO claims and the network, and are never parsed as HTML.

/** h('tag', {attr: value, onclick: fn}, child...) — children are nodes or strings (text). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = String(v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(typeof c === 'string' ? document.createTextNode(c) : c);
  }
  return el;
}

/** Replaces the page: sets the title, the content, and moves focus to its heading. */
export function show(title, ...children) {
  document.title = `${title} — Sallyport`;
  const main = document.getElementById('main');
  main.replaceChildren(...children);
  const heading = main.querySelector('h1');
  if (heading) {
    heading.setAttribute('tabindex', '-1');
    heading.focus({ preventScroll: true });
  }
}
