// views.js: the runs list with the new-task form, the files of a session, and the admin
// page. Everything shown comes from the /v1 API and is set as text.
'use strict';

UI.views.runs = async function () {
  const { api, el, $, toast, enc, when, duration, stateBadge } = UI;
  // The form is rendered with its button disabled: a submit before this handler exists would
  // be the browser's own (a reload that loses the task). Enabled once the handler is in place.
  $('#new-run').addEventListener('submit', async (e) => {
    e.preventDefault();
    const button = e.target.querySelector('button');
    button.disabled = true;
    try {
      let session = $('#session').value;
      const files = $('#files').files;
      if (files.length && !session) {
        const s = await api('POST', '/v1/sessions', {});
        if (s.status !== 201) { toast('No session: ' + UI.errorText(s), true); return; }
        session = s.data.id;
      }
      for (const f of files) {
        const up = await api('PUT', '/v1/sessions/' + enc(session) + '/files/content?path=' + enc(f.name), f);
        if (up.status !== 200) { toast(f.name + ' was not uploaded: ' + UI.errorText(up), true); return; }
      }
      const body = { task: $('#task').value, mode: $('#mode').value };
      // A plan's steps pick their profiles by tag; the profile is the agent mode's choice.
      if (body.mode === 'agent') body.agent = $('#agent').value;
      if (session) body.session_id = session;
      const r = await api('POST', '/v1/runs', body);
      if (r.status === 201) location.assign('/runs/' + enc(r.data.id));
      else toast('The run was not started: ' + UI.errorText(r), true);
    } finally {
      button.disabled = false;
    }
  });
  $('#new-run button[type=submit]').disabled = false;

  const me = (await api('GET', '/v1/me')).data;
  let cursor = null;
  const owner = $('#owner-filter');

  if (owner) {
    const users = await api('GET', '/v1/users');
    // An admin's list is everyone's unless filtered to one user.
    for (const u of (users.data || [])) {
      owner.append(el('option', { value: u.id, text: u.id === me.id ? u.name + ' (me)' : u.name }));
    }
    owner.addEventListener('change', () => { $('#runs').replaceChildren(); cursor = null; load(); });
  }

  const agents = await api('GET', '/v1/agents');
  for (const a of ((agents.data && agents.data.agents) || [])) {
    if (a.name === 'general') continue;
    $('#agent').append(el('option', { value: a.name, text: a.name + ': ' + a.description }));
  }
  $('#mode').addEventListener('change', () => { $('#agent').disabled = $('#mode').value !== 'agent'; });

  const sessions = await api('GET', '/v1/sessions?limit=100');
  for (const s of ((sessions.data && sessions.data.sessions) || [])) {
    // An MCP client's sandbox is driven through /mcp only; a run cannot use it.
    if (s.owner === me.id && s.kind !== 'mcp') {
      $('#session').append(el('option', { value: s.id, text: s.id + ' (since ' + when(s.created_at) + ')' }));
    }
  }

  async function load() {
    let q = '/v1/runs?limit=50';
    if (cursor) q += '&cursor=' + enc(cursor);
    if (owner && owner.value) q += '&owner=' + enc(owner.value);
    const r = await api('GET', q);
    if (r.status !== 200) { toast('Runs could not be listed: ' + UI.errorText(r), true); return; }
    for (const run of r.data.runs) {
      const end = run.ended_at ? new Date(run.ended_at) : new Date();
      const dur = run.started_at ? end - new Date(run.started_at) : null;
      $('#runs').append(el('tr', {},
        el('td', { class: 'task' }, el('a', { href: '/runs/' + enc(run.id), text: run.task })),
        el('td', {}, stateBadge(run.state)),
        el('td', { text: when(run.started_at || run.created_at) }),
        el('td', { text: duration(dur) }),
        el('td', { text: String(run.steps) }),
        el('td', { text: (run.usage.prompt_tokens + run.usage.completion_tokens).toLocaleString() })));
    }
    cursor = r.data.next_cursor;
    $('#more').hidden = !cursor;
  }
  $('#more').addEventListener('click', load);
  await load();

};

UI.views.files = async function () {
  const { api, el, $, toast, enc } = UI;
  const sid = document.body.dataset.session;
  const base = '/v1/sessions/' + enc(sid);
  $('#archive').setAttribute('href', base + '/archive');
  const IMAGES = { png: 'image/png', jpg: 'image/jpeg', jpeg: 'image/jpeg', gif: 'image/gif', webp: 'image/webp' };
  let objectUrl = null;

  async function list(path, into) {
    const r = await api('GET', base + '/files?path=' + enc(path));
    if (r.status !== 200) { toast(UI.errorText(r), true); return; }
    const ul = el('ul');
    const entries = r.data.entries.slice().sort((a, b) => (a.kind === 'dir') === (b.kind === 'dir') ? a.name.localeCompare(b.name) : a.kind === 'dir' ? -1 : 1);
    for (const e of entries) {
      const full = r.data.path + '/' + e.name;
      const li = el('li');
      const b = el('button', { type: 'button', class: 'entry ' + e.kind, text: e.name + (e.kind === 'dir' ? '/' : '') });
      b.dataset.path = full;
      if (e.kind === 'dir') {
        b.setAttribute('aria-expanded', 'false');
        b.addEventListener('click', async () => {
          const open = b.getAttribute('aria-expanded') === 'true';
          b.setAttribute('aria-expanded', String(!open));
          if (open) { li.querySelector('ul')?.remove(); } else { await list(full, li); }
        });
      } else {
        b.addEventListener('click', () => view(full, e));
      }
      li.append(b);
      ul.append(li);
    }
    if (!entries.length) ul.append(el('li', { class: 'hint', text: '(empty)' }));
    into.append(ul);
  }

  async function view(path, entry) {
    const viewer = $('#viewer');
    const name = path.split('/').pop();
    const ext = (name.includes('.') ? name.split('.').pop() : '').toLowerCase();
    const url = base + '/files/content?path=' + enc(path);
    if (objectUrl) { URL.revokeObjectURL(objectUrl); objectUrl = null; }
    const head = el('div', { class: 'row between' }, el('h2', { text: path }),
      el('a', { class: 'button', href: url, download: name, text: 'Download' }));
    viewer.replaceChildren(head);
    if (ext === 'html' || ext === 'htm') {
      // An opaque origin: no script, no cookies, no top navigation (and the server sends
      // a CSP sandbox header of its own).
      viewer.append(el('iframe', { class: 'preview', sandbox: '', title: 'Preview of ' + name,
        src: '/ui/preview/' + enc(sid) + '?path=' + enc(path), referrerpolicy: 'no-referrer' }));
      return;
    }
    if (entry.size > 2000000) { viewer.append(el('p', { class: 'hint', text: 'Too large to show; download it.' })); return; }
    const resp = await fetch(url, { credentials: 'same-origin' });
    if (!resp.ok) { viewer.append(el('p', { class: 'error', text: 'Could not read the file (' + resp.status + ').' })); return; }
    const buf = await resp.arrayBuffer();
    if (IMAGES[ext]) {
      objectUrl = URL.createObjectURL(new Blob([buf], { type: IMAGES[ext] }));
      viewer.append(el('img', { class: 'file-image', src: objectUrl, alt: name }));
      return;
    }
    const bytes = new Uint8Array(buf);
    if (bytes.includes(0)) { viewer.append(el('p', { class: 'hint', text: 'A binary file; download it.' })); return; }
    viewer.append(el('pre', { class: 'file-text', text: new TextDecoder().decode(bytes) }));
  }

  // The session's egress: its policy, counters and newest connections (all as text).
  async function egress() {
    const r = await api('GET', base + '/egress');
    if (r.status !== 200) { $('#egress-summary').textContent = UI.errorText(r); return; }
    const e = r.data, c = e.counters;
    $('#egress-summary').textContent = 'Policy ' + e.policy.join(', ') + ' (at most ' + e.widest.join(', ') +
      (e.quota ? '; your quota ' + e.quota.join(', ') : '') + '). ' + c.connections + ' connections, ' +
      c.refused + ' refused, ' + c.bytes_up + ' B up, ' + c.bytes_down + ' B down.';
    const rows = e.recent.map((x) => el('tr', { class: x.allowed ? '' : 'refused' },
      el('td', { text: x.started_at }), el('td', { text: x.method + ' ' + x.host + ':' + x.port }),
      el('td', { text: (x.allowed ? 'allowed by ' : 'refused by ') + x.rule + (x.reason ? ': ' + x.reason : '') }),
      el('td', { text: x.bytes_up + ' / ' + x.bytes_down })));
    if (!rows.length) rows.push(el('tr', {}, el('td', { colspan: 4, class: 'hint', text: 'No connections yet.' })));
    $('#egress').replaceChildren(...rows);
  }

  await Promise.all([list('/workspace', $('#tree')), egress()]);
};

UI.views.admin = async function () {
  const { api, el, $, toast, enc, since } = UI;
  const names = new Map();

  async function users() {
    const r = await api('GET', '/v1/users');
    if (r.status !== 200) { toast(UI.errorText(r), true); return; }
    const rows = r.data.map((u) => {
      names.set(u.id, u.name);
      const rotate = el('button', { type: 'button', text: 'Rotate key' });
      rotate.addEventListener('click', async () => {
        if (!confirm('Give ' + u.name + ' a new key? The old one stops working at once.')) return;
        const k = await api('POST', '/v1/users/' + enc(u.name) + '/rotate');
        if (k.status === 200) { showKey(k.data); users(); } else toast(UI.errorText(k), true);
      });
      const remove = el('button', { type: 'button', class: 'danger', text: 'Remove' });
      remove.addEventListener('click', async () => {
        if (!confirm('Remove ' + u.name + '? Their sessions end.')) return;
        const d = await api('DELETE', '/v1/users/' + enc(u.name));
        if (d.status === 204) { toast(u.name + ' was removed.'); users(); sessions(); } else toast(UI.errorText(d), true);
      });
      const tokens = u.quota.input_tokens_per_day ? ' / ' + u.quota.input_tokens_per_day.toLocaleString() : '';
      // The figure is read only for a user with a CPU quota (0 otherwise): no quota, no figure.
      const cpu = u.quota.cpu_seconds_per_day ? u.usage.cpu_seconds_today.toFixed(1) + ' / ' + u.quota.cpu_seconds_per_day.toLocaleString() : '—';
      return el('tr', { 'data-user': u.name },
        el('td', { text: u.name }), el('td', { text: u.admin ? 'yes' : 'no' }),
        el('td', { class: 'key' }, el('code', { text: u.key_prefix + '…' }),
          el('small', { text: ' made ' + u.key_created_at.slice(0, 10) +
            (u.expires_at ? ', expires ' + u.expires_at.slice(0, 10) : ', no expiry') })),
        el('td', { text: u.usage.active_sessions + ' / ' + u.quota.sessions +
          (u.usage.active_mcp_sessions ? ' (' + u.usage.active_mcp_sessions + ' MCP)' : '') }),
        el('td', { text: u.usage.active_runs + ' / ' + u.quota.runs }),
        el('td', { text: u.usage.input_tokens_today.toLocaleString() + tokens }),
        el('td', { text: cpu }),
        el('td', { class: 'actions' }, rotate, remove));
    });
    $('#users').replaceChildren(...rows);
  }

  function showKey(k) {
    const box = $('#new-key');
    box.replaceChildren(el('p', {}, 'The key of ', el('strong', { text: k.user.name }),
      ', shown only now; copy it:'), el('code', { class: 'secret', text: k.key }));
    box.hidden = false;
  }

  async function sessions() {
    const r = await api('GET', '/v1/sessions?limit=100');
    if (r.status !== 200) { toast(UI.errorText(r), true); return; }
    const rows = r.data.sessions.map((s) => {
      const end = el('button', { type: 'button', class: 'danger', text: 'End' });
      end.addEventListener('click', async () => {
        if (!confirm('End session ' + s.id + '? Its container is removed; its runs and events stay until the retention period (delete them below).')) return;
        const d = await api('DELETE', '/v1/sessions/' + enc(s.id));
        if (d.status === 204) { toast('Session ended.'); sessions(); users(); } else toast(UI.errorText(d), true);
      });
      // A hibernated session holds no container: its next use (or Resume) restores its files.
      const hibernated = s.state === 'hibernated';
      const flip = el('button', { type: 'button', text: hibernated ? 'Resume' : 'Hibernate' });
      flip.addEventListener('click', async () => {
        const d = await api('POST', '/v1/sessions/' + enc(s.id) + (hibernated ? '/resume' : '/hibernate'));
        if (d.status === 200) { toast('Session ' + d.data.state + '.'); sessions(); } else toast(UI.errorText(d), true);
      });
      const actions = s.kind === 'mcp' ? el('td', {}, end) : el('td', {}, end, ' ', flip);
      return el('tr', { 'data-session': s.id, 'data-state': s.state },
        // An MCP client's sandbox has no files page (it is used through /mcp only).
        el('td', {}, s.kind === 'mcp'
          ? el('span', {}, el('code', { text: s.id }), ' ', el('span', { class: 'badge', text: 'MCP' }))
          : el('span', {}, el('a', { href: '/sessions/' + enc(s.id) + '/files', text: s.id }),
            hibernated ? ' ' : '', hibernated ? el('span', { class: 'badge', text: 'hibernated' }) : '')),
        el('td', { text: names.get(s.owner) || s.owner }),
        el('td', { text: since(s.created_at) }), el('td', { text: since(s.last_used_at) }),
        actions);
    });
    if (!rows.length) rows.push(el('tr', {}, el('td', { colspan: 5, class: 'hint', text: 'No live sessions.' })));
    $('#sessions').replaceChildren(...rows);
    await ended();
  }

  // Ended sessions keep their runs and events until the retention period; deleting that
  // history now is a separate call, confirmed here first.
  async function ended() {
    const r = await api('GET', '/v1/sessions?limit=100&include_ended=true');
    if (r.status !== 200) { toast(UI.errorText(r), true); return; }
    const rows = r.data.sessions.filter((s) => s.state === 'ended').map((s) => {
      const purge = el('button', { type: 'button', class: 'danger', text: 'Delete history' });
      purge.addEventListener('click', async () => {
        if (!confirm('Delete the history of session ' + s.id + '? Its runs, their events and images are deleted for good.')) return;
        const d = await api('DELETE', '/v1/sessions/' + enc(s.id) + '/history');
        if (d.status === 204) { toast('History deleted.'); ended(); } else toast(UI.errorText(d), true);
      });
      return el('tr', { 'data-session': s.id },
        el('td', { text: s.id }),
        el('td', { text: names.get(s.owner) || s.owner }),
        el('td', { text: since(s.ended_at || s.last_used_at) }),
        el('td', { text: s.end_reason || '' }),
        el('td', {}, purge));
    });
    if (!rows.length) rows.push(el('tr', {}, el('td', { colspan: 5, class: 'hint', text: 'No ended sessions.' })));
    $('#ended-sessions').replaceChildren(...rows);
  }

  $('#add-user').addEventListener('submit', async (e) => {
    e.preventDefault();
    const r = await api('POST', '/v1/users', { name: $('#new-name').value, admin: $('#new-admin').checked });
    if (r.status === 201) { showKey(r.data); $('#new-name').value = ''; users(); } else toast(UI.errorText(r), true);
  });

  // The audit log, newest first; every value is set as text.
  async function audit() {
    const r = await api('GET', '/v1/audit?order=newest&limit=100');
    if (r.status !== 200) { toast(UI.errorText(r), true); return; }
    const rows = r.data.entries.map((a) => el('tr', { 'data-seq': String(a.seq) },
      el('td', { text: since(a.at) }), el('td', { text: a.actor }),
      el('td', {}, el('code', { text: a.action })), el('td', { text: a.target }),
      el('td', { text: a.client }), el('td', {}, el('code', { text: JSON.stringify(a.details) }))));
    if (!rows.length) rows.push(el('tr', {}, el('td', { colspan: 6, class: 'hint', text: 'No entries yet.' })));
    $('#audit').replaceChildren(...rows);
  }

  // Usage metering over the last 30 days: each user's totals and a chart of their
  // CPU-seconds per day, an inline SVG drawn here (no library, no CDN); every value is set
  // as text or as a number attribute.
  async function usage() {
    const r = await api('GET', '/v1/usage?days=30');
    if (r.status !== 200) { toast(UI.errorText(r), true); return; }
    const start = Date.parse(r.data.from + 'T00:00:00Z');
    const days = Array.from({ length: 30 }, (_, i) => new Date(start + i * 86400000).toISOString().slice(0, 10));
    const byUser = new Map();
    for (const d of r.data.days) {
      if (!byUser.has(d.user)) byUser.set(d.user, new Map());
      byUser.get(d.user).set(d.day, d.usage);
    }
    const sum = (m, f) => Array.from(m.values()).reduce((a, u) => a + f(u), 0);
    const tokens = (u, k) => u.tokens.reduce((a, t) => a + t[k], 0);
    const num = (n, digits) => n.toLocaleString(undefined, { maximumFractionDigits: digits });
    const rows = Array.from(byUser.entries()).sort((a, b) => (a[0] < b[0] ? -1 : 1)).map(([user, m]) =>
      el('tr', { 'data-user': user },
        el('td', { text: user }),
        el('td', { text: num(sum(m, (u) => u.cpu_seconds), 1) }),
        el('td', { text: num(sum(m, (u) => u.memory_gib_seconds), 1) }),
        el('td', { text: num(sum(m, (u) => u.wall_seconds), 0) }),
        el('td', { text: num(sum(m, (u) => u.bytes_in), 0) + ' / ' + num(sum(m, (u) => u.bytes_out), 0) }),
        el('td', { text: num(sum(m, (u) => u.tool_calls), 0) }),
        el('td', { text: num(sum(m, (u) => tokens(u, 'tokens_in')), 0) + ' / ' + num(sum(m, (u) => tokens(u, 'tokens_out')), 0) }),
        el('td', {}, chart(days.map((day) => [day, m.has(day) ? m.get(day).cpu_seconds : 0])))));
    if (!rows.length) rows.push(el('tr', {}, el('td', { colspan: 8, class: 'hint', text: 'Nothing used yet.' })));
    $('#usage').replaceChildren(...rows);
  }

  // One bar per day, scaled to the busiest; each bar's title says its day and value.
  function chart(points) {
    const ns = 'http://www.w3.org/2000/svg';
    const node = (tag, attrs) => {
      const n = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
      return n;
    };
    const w = 4, h = 32, max = Math.max(...points.map((p) => p[1]), 0);
    const svg = node('svg', { class: 'spark', width: points.length * w, height: h, viewBox: '0 0 ' + points.length * w + ' ' + h, role: 'img' });
    const label = node('title', {});
    label.textContent = 'CPU-seconds per day, the last ' + points.length + ' days';
    svg.append(label);
    points.forEach(([day, v], i) => {
      const bh = max > 0 ? Math.max(v > 0 ? 1 : 0, Math.round((v / max) * h)) : 0;
      const bar = node('rect', { x: i * w, y: h - bh, width: w - 1, height: bh, 'data-day': day });
      const t = node('title', {});
      t.textContent = day + ': ' + v.toFixed(1) + ' CPU s';
      bar.append(t);
      svg.append(bar);
    });
    return svg;
  }

  await users();
  await sessions();
  await usage();
  await audit();
};
