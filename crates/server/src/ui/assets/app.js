// app.js: the helpers every page of the sandboxd web UI shares (API calls with the CSRF
// token, element building, formatting), and the start of the page's view.
//
// Safety rule of all three scripts: strings from the API (the model's, the sandbox's, other
// users') reach the page only through textContent, attribute values set with setAttribute on
// known names, or HTML fragments the server rendered and sanitised (POST /ui/render). They
// never use innerHTML on a string they built, eval, or inline handlers; the CSP forbids
// inline script anyway.
'use strict';

const UI = (() => {
  const meta = document.querySelector('meta[name="csrf-token"]');
  const csrf = meta ? meta.getAttribute('content') : '';
  const views = {};

  // One API call. Returns {status, data}; data is the parsed JSON (or null).
  async function api(method, path, body, opts) {
    const headers = { 'X-CSRF-Token': csrf };
    const init = { method, headers, credentials: 'same-origin' };
    if (body instanceof Blob || body instanceof ArrayBuffer) {
      headers['Content-Type'] = 'application/octet-stream';
      init.body = body;
    } else if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (e) {
      return { status: 0, data: { error: { code: 'network', message: 'the server cannot be reached' } } };
    }
    if (resp.status === 401 && !(opts && opts.noRedirect)) {
      location.assign('/login');
    }
    let data = null;
    const type = resp.headers.get('Content-Type') || '';
    if (type.startsWith('application/json')) {
      try { data = await resp.json(); } catch (e) { data = null; }
    }
    return { status: resp.status, data };
  }

  function errorText(r) {
    if (r.data && r.data.error) return r.data.error.message;
    return 'the request failed (' + r.status + ')';
  }

  // el('a', {class: 'x', href: '/y'}, 'text', child): text children become text nodes.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'text') node.textContent = String(v);
      else node.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
    }
    return node;
  }

  // An HTML fragment the server rendered and sanitised, as nodes.
  function fragment(html) {
    const t = document.createElement('template');
    t.innerHTML = html;
    return t.content;
  }

  function $(sel) { return document.querySelector(sel); }

  let toastTimer = null;
  function toast(message, isError) {
    const t = $('#toast');
    if (!t) return;
    t.textContent = message;
    t.className = isError ? 'show error' : 'show';
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { t.className = ''; }, 5000);
  }

  function when(iso) {
    if (!iso) return '–';
    const d = new Date(iso);
    return isNaN(d) ? '–' : d.toLocaleString();
  }

  function duration(ms) {
    if (ms === null || ms === undefined || isNaN(ms) || ms < 0) return '–';
    const s = Math.round(ms / 1000);
    if (s < 60) return s + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
    return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
  }

  function since(iso) {
    return iso ? duration(Date.now() - new Date(iso).getTime()) : '–';
  }

  const TERMINAL = ['succeeded', 'failed', 'cancelled', 'interrupted'];

  function stateBadge(state) {
    return el('span', { class: 'badge st-' + String(state).replace(/[^a-z_]/g, ''), text: String(state).replace(/_/g, ' ') });
  }

  function enc(s) { return encodeURIComponent(s); }

  document.addEventListener('DOMContentLoaded', () => {
    const page = document.body.dataset.page;
    if (views[page]) {
      views[page]().catch((e) => toast('The page failed: ' + e, true));
    }
  });

  return { api, errorText, el, fragment, $, toast, when, duration, since, TERMINAL, stateBadge, enc, views, csrf };
})();
