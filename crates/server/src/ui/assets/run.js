// run.js: the run view. Follows GET /v1/runs/{id}/events over EventSource (the browser
// resumes with Last-Event-ID after a drop; events at or below the last seq seen are
// ignored, so a replay never duplicates a step), has the server render each batch of events
// into timeline fragments (POST /ui/render), and keeps the header (state, tokens, steps)
// current. Stop, the answer to ask_human and the follow-up use the runs API. While the run
// is live, `delta` events (no id, never replayed) show the model's text as it is written in
// one live box, replaced by the step's own events when they are drawn (never before: the
// text is on the page throughout). A (re)connected stream starts with the text so far of the
// answer being written, so the box starts again on every connection; a retry voids it.
'use strict';

UI.views.run = async function () {
  const { api, el, fragment, $, toast, enc, TERMINAL } = UI;
  const id = document.body.dataset.run;
  const timeline = $('#timeline');
  const cards = new Map(); // call_id -> the card element of that tool call
  let lastSeq = 0; // the highest seq received
  let queue = []; // received events not yet rendered, in seq order
  let rendering = false;
  let source = null;
  let run = null;
  let state = 'queued';
  let liveBox = null; // the text of the answer being written
  let endSeq = 0; // the seq of the last event received that ends or voids an answer
  // The events that draw an answer's text, or end or void it: its live box goes then.
  const ENDS = ['assistant_text', 'tool_call', 'retry', 'nudge', 'error', 'run_finished'];
  const TYPES = ['run_started', 'notice', 'thinking', 'context_trimmed', 'context_condensed', 'retry', 'token_usage',
    'assistant_text', 'tool_call', 'tool_result', 'tool_image', 'nudge', 'error', 'run_finished', 'run_state',
    'question_asked', 'question_answered', 'plan_created', 'step_started', 'step_finished',
    'replanned', 'flow_finished', 'message'];

  const r = await api('GET', '/v1/runs/' + enc(id));
  if (r.status === 404) {
    document.title = 'Not found · sandboxd';
    $('#main').replaceChildren(el('h1', { text: 'Not found' }),
      el('p', {}, 'There is no run here for you. ', el('a', { href: '/runs', text: 'Your runs' })));
    return;
  }
  if (r.status !== 200) {
    toast(UI.errorText(r), true);
    return;
  }
  run = r.data;
  $('#run-title').textContent = run.task.length > 80 ? run.task.slice(0, 80) + '…' : run.task;
  $('#files-link').setAttribute('href', '/sessions/' + enc(run.session_id) + '/files');
  setUsage(run.usage.prompt_tokens, run.usage.completion_tokens);
  setSteps(run.steps);
  setState(run.state);
  if (run.question) showQuestion(run.question.text);
  connect();

  function setState(s) {
    state = s;
    const badge = $('#state');
    badge.textContent = s.replace(/_/g, ' ');
    badge.className = 'badge st-' + s.replace(/[^a-z_]/g, '');
    document.body.dataset.state = s;
    const done = TERMINAL.includes(s);
    $('#stop').hidden = done;
    $('#follow-up').hidden = !done;
    if (done) {
      $('#answer-box').hidden = true;
      if (source && lastSeq >= (run.last_seq || 0)) closeStream();
    }
  }

  function setUsage(p, c) { $('#usage').textContent = p + ' + ' + c + ' tokens'; }
  function setSteps(n) { $('#steps').textContent = n + (n === 1 ? ' step' : ' steps'); }

  function showQuestion(text) {
    $('#question').textContent = 'The agent asks: ' + text;
    $('#answer-box').hidden = false;
  }

  function closeStream() {
    if (source) source.close();
    source = null;
    $('#live').textContent = 'complete';
  }

  function connect() {
    source = new EventSource('/v1/runs/' + enc(id) + '/events' + (lastSeq ? '?after=' + lastSeq : ''));
    source.onopen = () => {
      $('#live').textContent = 'live';
      // The server sends the answer's text so far first: what the box held (perhaps with
      // pieces lost while disconnected) goes.
      dropLive(Infinity);
    };
    source.onerror = (e) => {
      if (!source) return;
      // The server's last event when the key or sign-in was revoked: reconnecting is futile.
      if (e && typeof e.data === 'string' && e.data.includes('credential_revoked')) {
        source.close();
        source = null;
        $('#live').textContent = 'signed out: sign in again to follow';
        return;
      }
      if (TERMINAL.includes(state) && lastSeq >= (run.last_seq || 0)) closeStream();
      else $('#live').textContent = 'reconnecting…';
    };
    for (const t of TYPES) source.addEventListener(t, onEvent);
    source.addEventListener('delta', onDelta);
  }

  function onDelta(e) {
    let d;
    try { d = JSON.parse(e.data); } catch (err) { return; }
    if (typeof d.text !== 'string' || typeof d.after_seq !== 'number') return;
    // Another step's answer, or the same step's after a retry (the answer starts again).
    // An ended answer's box stays until its events are drawn (a retry's went at once).
    if (!liveBox || liveBox.dataset.step !== String(d.step) || endSeq > Number(liveBox.dataset.after)) {
      // `after` is the event the answer follows: the step's own events come after it.
      liveBox = el('div', { class: 'item ev live-text', 'data-step': String(d.step), 'data-after': String(d.after_seq) });
      timeline.append(liveBox);
    }
    const stick = window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
    liveBox.textContent += d.text;
    document.body.dataset.liveMs = String(Math.round(performance.now()));
    if (stick) window.scrollTo(0, document.body.scrollHeight);
  }

  // The live text of the answers that came before event `seq` (drawn now, or void).
  function dropLive(seq) {
    for (const box of timeline.querySelectorAll(':scope > .live-text')) {
      if (Number(box.dataset.after) < seq) box.remove();
    }
    if (liveBox && !liveBox.isConnected) liveBox = null;
  }

  // An event's item goes before the live text of an answer written after it.
  function append(node, seq) {
    const later = [...timeline.querySelectorAll(':scope > .live-text')].find((b) => Number(b.dataset.after) >= seq);
    timeline.insertBefore(node, later || null);
  }

  function onEvent(e) {
    let ev;
    try { ev = JSON.parse(e.data); } catch (err) { return; }
    const seq = Number(ev.seq || e.lastEventId || 0);
    if (!(seq > lastSeq)) return; // already seen: a replay after a reconnect
    lastSeq = seq;
    run.last_seq = Math.max(run.last_seq || 0, seq);
    if (ENDS.includes(ev.type)) endSeq = seq;
    // A retry starts the answer again: its text so far is void.
    if (ev.type === 'retry' && liveBox && Number(liveBox.dataset.after) < seq) {
      liveBox.remove();
      liveBox = null;
    }
    switch (ev.type) {
      case 'token_usage':
        setUsage(ev.total_prompt_tokens, ev.total_completion_tokens);
        setSteps(ev.step);
        break;
      case 'run_state': setState(ev.state); break;
      case 'question_asked': showQuestion(ev.question); break;
      case 'question_answered': $('#answer-box').hidden = true; break;
      case 'run_finished':
        setUsage(ev.prompt_tokens, ev.completion_tokens);
        setSteps(ev.steps);
        break;
    }
    queue.push(ev);
    if (!rendering) render();
    if (ev.type === 'run_finished' || ev.type === 'flow_finished') {
      // The state change may come after; ask once so the header is right either way. A run
      // never leaves a final state: an answer read before the change but slow to arrive (a
      // loaded server) must not take the page back to `running` after the run_state event.
      api('GET', '/v1/runs/' + enc(id)).then((r) => {
        if (r.status === 200 && !TERMINAL.includes(state)) { run = r.data; setState(r.data.state); }
      });
    }
  }

  // Renders what is queued, one request at a time: live events go at once, a replay's
  // burst in batches (bounded in events and bytes).
  async function render() {
    rendering = true;
    while (queue.length) {
      let size = 0;
      let n = 0;
      while (n < queue.length && n < 500 && size < 4000000) {
        size += JSON.stringify(queue[n]).length;
        n += 1;
      }
      const batch = queue.slice(0, n);
      const r = await api('POST', '/ui/render', { events: batch });
      if (r.status !== 200) {
        toast('The timeline could not be drawn: ' + UI.errorText(r), true);
        await new Promise((res) => setTimeout(res, 1000));
        continue;
      }
      queue = queue.slice(n);
      const stick = window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
      // The step's answer is drawn now: its live text goes in the same turn, so one of the
      // two is always shown (not a next step's text, already live).
      for (const ev of batch) {
        if (ENDS.includes(ev.type)) dropLive(ev.seq || 0);
      }
      for (const f of r.data.fragments) place(f);
      document.body.dataset.rendered = String(batch[batch.length - 1].seq || 0);
      document.body.dataset.renderedMs = String(Math.round(performance.now()));
      if (stick) window.scrollTo(0, document.body.scrollHeight);
    }
    rendering = false;
  }

  function place(f) {
    const nodes = fragment(f.html);
    const wrap = el('div', { class: 'item', 'data-seq': f.seq, 'data-kind': f.kind });
    wrap.append(nodes);
    if (f.kind === 'tool_call') {
      cards.set(f.call_id, wrap);
      append(wrap, f.seq);
      return;
    }
    if (f.kind === 'tool_result' && cards.has(f.call_id)) {
      const card = cards.get(f.call_id);
      const status = card.querySelector('.status');
      status.textContent = f.status === 'error' ? 'error' : 'done';
      status.className = 'status ' + (f.status === 'error' ? 'error' : 'ok');
      card.querySelector('.dur').textContent = (f.duration_ms / 1000).toFixed(1) + ' s';
      card.querySelector('.result').replaceChildren(wrap);
      return;
    }
    // A cell's further figures join its result, in order.
    if (f.kind === 'tool_image' && cards.has(f.call_id)) {
      cards.get(f.call_id).querySelector('.result').append(wrap);
      return;
    }
    append(wrap, f.seq);
  }

  $('#stop').addEventListener('click', async () => {
    const b = $('#stop');
    b.disabled = true;
    b.textContent = 'Stopping…';
    setStateText('stopping');
    const r = await api('POST', '/v1/runs/' + enc(id) + '/cancel');
    b.disabled = false;
    b.textContent = 'Stop';
    if (r.status === 200) {
      setState(r.data.state);
      toast(r.data.state === 'cancelled' ? 'The run was stopped.' : 'The run had already ended (' + r.data.state + ').');
    } else {
      setState(state);
      toast('Stop failed: ' + UI.errorText(r), true);
    }
  });

  function setStateText(t) { $('#state').textContent = t; }

  $('#answer-box').addEventListener('submit', async (e) => {
    e.preventDefault();
    const text = $('#answer').value;
    const r = await api('POST', '/v1/runs/' + enc(id) + '/answer', { answer: text });
    if (r.status === 200) {
      $('#answer').value = '';
      $('#answer-box').hidden = true;
      toast('Answer sent.');
    } else {
      toast('The answer was not taken: ' + UI.errorText(r), true);
    }
  });

  $('#follow-up').addEventListener('submit', async (e) => {
    e.preventDefault();
    const body = { task: $('#follow').value, session_id: run.session_id };
    if (run.agent && run.mode !== 'plan') body.agent = run.agent; // the same profile again
    const r = await api('POST', '/v1/runs', body);
    if (r.status === 201) location.assign('/runs/' + enc(r.data.id));
    else toast('The follow-up was not started: ' + UI.errorText(r), true);
  });
};
