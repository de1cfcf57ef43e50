// The mesolite web UI. No build step, no libraries: the master pushes its state
// over server-sent events (GET events), this script renders it, keeps a few
// minutes of history for the charts (drawn as SVG) and reads task sandboxes
// through the master (GET agents/{agent}/sandbox/{framework}/{task}/{file}).
'use strict';

(() => {
  const HISTORY_MS = 5 * 60 * 1000; // chart history kept in the page
  const MIN_SPAN_MS = 20 * 1000; // the narrowest chart window
  const SAMPLE_MS = 1000; // charts advance this often between events
  const LOG_BYTES = 64 * 1024; // tail of a sandbox file shown
  const MAX_TASK_ROWS = 300;
  const SVG_NS = 'http://www.w3.org/2000/svg'; // a namespace name, not a download
  const PALETTE = ['#2563eb', '#e8590c', '#0ca678', '#c2255c', '#7048e8', '#f59f00',
    '#1098ad', '#5c940d', '#862e9c', '#495057'];
  const RESOURCE_ORDER = ['cpus', 'mem', 'disk', 'gpus'];
  const RESOURCE_LABEL = { cpus: 'CPUs', mem: 'Memory', disk: 'Disk', gpus: 'GPUs' };

  const $ = (id) => document.getElementById(id);

  let state = null; // the last snapshot
  let connected = false;
  const history = []; // {t, cpus, mem, shares: {frameworkId: dominant share}}
  const frameworks = new Map(); // id -> {name, color}: every framework seen, for the legend

  // Formatting -----------------------------------------------------------

  function fmtMB(mb) {
    if (mb >= 1024 * 1024) return `${trim(mb / (1024 * 1024))} TB`;
    if (mb >= 1024) return `${trim(mb / 1024)} GB`;
    return `${trim(mb)} MB`;
  }

  function trim(x) {
    return String(Math.round(x * 100) / 100);
  }

  // A weight: one number, or a weight vector (one per resource it names; others weigh `weight`).
  function fmtWeight(weight, resourceWeights) {
    const named = Object.entries(resourceWeights || {}).sort(([a], [b]) => a.localeCompare(b));
    if (!named.length) return trim(weight);
    return named.map(([n, w]) => `${n} ${trim(w)}`).join(' · ') + ` · others ${trim(weight)}`;
  }

  function fmtAmount(name, value) {
    return name === 'mem' || name === 'disk' ? fmtMB(value) : trim(value);
  }

  function resourceNames(res) {
    const names = Object.keys(res || {});
    const known = RESOURCE_ORDER.filter((n) => names.includes(n));
    return known.concat(names.filter((n) => !RESOURCE_ORDER.includes(n)).sort());
  }

  function fmtRes(res) {
    const parts = resourceNames(res)
      .filter((n) => res[n] > 0)
      .map((n) => `${n} ${fmtAmount(n, res[n])}`);
    return parts.length ? parts.join(' · ') : '—';
  }

  function pct(x) {
    if (!Number.isFinite(x)) return '—';
    const p = x * 100;
    return `${p > 0 && p < 10 ? p.toFixed(1) : Math.round(p)}%`;
  }

  function dominant(res, total) {
    let share = 0;
    for (const n of Object.keys(res || {})) {
      if (total[n] > 0) share = Math.max(share, res[n] / total[n]);
    }
    return share;
  }

  function shortState(s) {
    return (s || '').replace(/^TASK_/, '');
  }

  function fmtDuration(seconds) {
    seconds = Math.max(0, Math.floor(seconds));
    const d = Math.floor(seconds / 86400);
    const h = Math.floor((seconds % 86400) / 3600);
    const m = Math.floor((seconds % 3600) / 60);
    const s = seconds % 60;
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${s}s`;
    return `${s}s`;
  }

  function fmtClock(unixSeconds) {
    if (!unixSeconds) return '—';
    return new Date(unixSeconds * 1000).toLocaleTimeString();
  }

  // DOM helpers ------------------------------------------------------------

  // el('td', {class: 'num', title: '...', data: {taskId: 'x'}}, child, 'text', ...)
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === 'class') node.className = v;
      else if (k === 'data') Object.assign(node.dataset, v);
      else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }

  function meter(fraction, label, marker, color) {
    const fill = el('div', { class: 'fill' });
    fill.style.width = `${Math.min(Math.max(fraction, 0), 1) * 100}%`;
    if (color) fill.style.background = color;
    const bar = el('div', { class: 'bar' }, fill);
    if (marker !== undefined && marker !== null && marker > 0) {
      const tick = el('div', { class: 'marker' });
      tick.style.left = `${Math.min(marker, 1) * 100}%`;
      bar.append(tick);
    }
    return el('div', { class: 'meter' }, bar, el('span', { class: 'meter-label' }, label));
  }

  function badge(text, kind) {
    return el('span', { class: `badge ${kind}` }, text);
  }

  // A task the master will preempt (master/preemptions.py): for whom, and when.
  function preemptingBadge(t) {
    const p = t.preempting;
    if (!p) return null;
    const when = p.kill_in > 0 ? ` in ${Math.ceil(p.kill_in)} s` : ', killing';
    const b = badge(`preempted${when}`, 'state warn');
    b.title = `for role ${p.for_role} (${p.kind.replace('_', '-')})`;
    return b;
  }

  function stateBadge(s) {
    const short = shortState(s);
    const kind = {
      RUNNING: 'ok', STARTING: 'info', STAGING: 'info', KILLING: 'warn', FINISHED: 'done',
      FAILED: 'bad', ERROR: 'bad', KILLED: 'warn', LOST: 'bad', DROPPED: 'bad',
      UNREACHABLE: 'warn', GONE: 'bad',
    }[short] || 'info';
    return badge(short, `state ${kind}`);
  }

  // A name over a smaller line (an id, an address); `extra` follows the name (a badge).
  function idLine(main, sub, extra) {
    return el('div', { class: 'id-cell' }, el('div', { class: 'main' }, main, extra || null),
      sub ? el('div', { class: 'sub' }, sub) : null);
  }

  // Show `rows` ([key, build] pairs: build() makes the <tr>) in a table. A row whose
  // key (everything it shows) is unchanged keeps its element, so what the reader
  // hovers, clicks or selects does not vanish under them at every update.
  function fillTable(id, rows, empty) {
    const body = $(id).tBodies[0];
    if (!rows.length) {
      const columns = $(id).tHead.rows[0].cells.length;
      rows = [row(['empty', empty], () => el('tr', { class: 'empty' },
        el('td', { colspan: columns }, empty)))];
    }
    const old = new Map();
    for (const tr of body.rows) old.set(tr.dataset.key, tr);
    const next = rows.map(([key, build]) => {
      let tr = old.get(key);
      old.delete(key);
      if (!tr) {
        tr = build();
        tr.dataset.key = key;
      }
      return tr;
    });
    const same = next.length === body.rows.length && next.every((tr, i) => body.rows[i] === tr);
    if (!same) body.replaceChildren(...next);
  }

  function row(data, build) {
    return [JSON.stringify(data), build];
  }

  function colorOf(frameworkId, name) {
    let f = frameworks.get(frameworkId);
    if (!f) {
      f = { name, color: PALETTE[frameworks.size % PALETTE.length] };
      frameworks.set(frameworkId, f);
    }
    f.name = name;
    return f.color;
  }

  // Rendering --------------------------------------------------------------

  function renderHeader() {
    if (!state) return;
    const up = Date.now() / 1000 - state.started_at;
    // Highly available masters: which one leads (this one) and who stands by.
    const ha = state.leader
      ? ` · leading ${state.leader.grpc} · standbys ${
          (state.standbys || []).map((m) => m.grpc).join(', ') || 'none'}`
      : '';
    $('meta').textContent =
      `master ${state.master_id} · policy ${state.policy} · up ${fmtDuration(up)}${ha}`;
  }

  function renderSummary() {
    const c = state.cluster;
    const healthy = state.agents.filter((a) => a.healthy).length;
    const cards = [
      ['Agents', `${c.agents}`, healthy === c.agents ? 'all healthy' : `${healthy} healthy`],
      ['Frameworks', `${c.frameworks}`,
        `${state.frameworks.filter((f) => f.connected).length} connected`],
      ['Running tasks', `${c.running_tasks}`, `${(state.completed_tasks || []).length} ended recently`],
      ['Offers out', `${c.outstanding_offers}`, 'outstanding'],
    ].map(([label, value, sub]) => el('div', { class: 'card' },
      el('div', { class: 'label' }, label), el('div', { class: 'value' }, value),
      el('div', { class: 'sub' }, sub)));
    const names = resourceNames(c.total);
    const meters = names.map((n) => {
      const total = c.total[n] || 0;
      const used = (c.allocated || {})[n] || 0;
      const share = total > 0 ? used / total : 0;
      return el('div', { class: 'card resource' },
        el('div', { class: 'label' }, RESOURCE_LABEL[n] || n),
        el('div', { class: 'value' }, pct(share), el('span', { class: 'unit' }, ' allocated')),
        meter(share, `${fmtAmount(n, used)} of ${fmtAmount(n, total)}`));
    });
    if (!names.length) {
      meters.push(el('div', { class: 'card resource' }, el('div', { class: 'label' }, 'Resources'),
        el('div', { class: 'value' }, '—'), el('div', { class: 'sub' }, 'no agents yet')));
    }
    $('summary').replaceChildren(...cards, ...meters);
  }

  function renderFrameworks() {
    const list = [...state.frameworks].sort((a, b) => a.name.localeCompare(b.name));
    $('frameworks-count').textContent = list.length ? `${list.length}` : '';
    fillTable('frameworks', list.map((f) => {
      const color = colorOf(f.id, f.name);
      const shown = [f.id, f.name, f.role, f.weight, f.resource_weights, f.user, f.allocated,
        f.dominant_share, f.running_tasks, f.completed_tasks, f.connected, f.suppressed, color];
      return row(shown, () => {
        const swatch = el('span', { class: 'swatch' });
        swatch.style.background = color;
        let status = f.connected ? null : badge('disconnected', 'warn');
        if (f.connected && f.suppressed) status = badge('suppressed', 'info');
        return el('tr', { data: { frameworkId: f.id } },
          el('td', {}, el('div', { class: 'with-swatch' }, swatch, idLine(f.name, f.id, status))),
          el('td', {}, idLine(f.role, `weight ${fmtWeight(f.weight, f.resource_weights)}`
            + (f.user ? ` · tasks run as ${f.user}` : ''))),
          el('td', { class: 'res' }, fmtRes(f.allocated)),
          el('td', {}, meter(f.dominant_share, pct(f.dominant_share), null, color)),
          el('td', { class: 'num' }, idLine(`${f.running_tasks}`, `${f.completed_tasks} ended`)));
      });
    }), 'No frameworks are subscribed.');
  }

  // Allocated as the bar; what its tasks use, as the agent measures it, as the marker.
  function agentMeter(a, name) {
    const total = a.total[name] || 0;
    const used = a.allocated[name] || 0;
    if (!total) return '—';
    const usage = a.usage && name in a.usage ? a.usage[name] : null;
    const label = `${fmtAmount(name, used)} / ${fmtAmount(name, total)}` +
      (usage === null ? '' : ` · using ${fmtAmount(name, usage)}`);
    return meter(used / total, label, usage === null ? undefined : usage / total);
  }

  // A running task's use beside what it was given; '—' where it is not measured.
  function taskUsage(t) {
    const u = t.usage;
    if (!u) return el('span', { title: 'not measured: its agent has no cgroups' }, '—');
    const cpus = `CPU ${trim(u.cpus_used)} / ${trim(t.resources.cpus || 0)}`;
    const mem = `mem ${fmtMB(u.mem_used_mb)} / ${fmtMB(t.resources.mem || 0)}`;
    const title = `peak ${fmtMB(u.mem_peak_mb)}, ${trim(u.cpu_seconds)} CPU seconds, ` +
      `${u.processes} processes and threads`;
    return el('span', { title }, `${cpus} · ${mem}`);
  }

  function renderAgents() {
    const list = [...state.agents].sort((a, b) => a.hostname.localeCompare(b.hostname));
    $('agents-count').textContent = list.length ? `${list.length}` : '';
    fillTable('agents', list.map((a) => row(
      [a.id, a.hostname, a.address, a.total, a.allocated, a.usage, a.isolation, a.running_tasks,
        a.connected, a.healthy],
      () => {
        let status = null;
        if (!a.connected) status = badge('disconnected', 'bad');
        else if (!a.healthy) status = badge('unhealthy', 'warn');
        else if (a.isolation === 'process-tree') status = badge('no cgroups', 'warn');
        const title = `${a.id}; tasks contained by ${a.isolation || 'unknown'}` +
          (a.task_user ? `, run as ${a.task_user}` : '');
        return el('tr', { data: { agentId: a.id } },
          el('td', { title }, idLine(a.hostname, `${a.id} · ${a.address || 'no sandbox address'}`,
            status)),
          el('td', {}, agentMeter(a, 'cpus')),
          el('td', {}, agentMeter(a, 'mem')),
          el('td', { class: 'res' }, fmtRes(a.free)),
          el('td', { class: 'num' }, `${a.running_tasks}`));
      })), 'No agents have registered.');
  }

  function renderRoles() {
    const total = state.cluster.total;
    fillTable('roles', state.roles.map((r) => row([r, total], () => {
      const depth = r.path === '*' ? 0 : r.path.split('/').length - 1;
      const name = el('div', { class: 'role-name' }, r.path.split('/').pop());
      name.style.paddingLeft = `${depth * 18}px`;
      if (depth) name.classList.add('child');
      const steady = dominant(r.steady_fair_share, total);
      const inst = dominant(r.instantaneous_fair_share, total);
      const title = `allocated ${pct(r.dominant_share)}, instantaneous fair share ${pct(inst)}, ` +
        `steady fair share ${pct(steady)} (dominant shares of the cluster)`;
      return el('tr', { data: { role: r.path }, class: r.active ? '' : 'idle' },
        el('td', { title: r.path }, name),
        el('td', { class: 'num' }, fmtWeight(r.weight, r.resource_weights)),
        el('td', { class: 'num' }, `${r.frameworks}`),
        el('td', { class: 'res' }, fmtRes(r.allocated)),
        el('td', { class: 'res' }, fmtRes(r.steady_fair_share)),
        el('td', { class: 'res' }, fmtRes(r.instantaneous_fair_share)),
        el('td', { title }, meter(r.dominant_share, `${pct(r.dominant_share)} | ${pct(inst)}`, inst)));
    })), 'No roles.');
  }

  function logButtons(task) {
    const data = { agentId: task.agent_id, frameworkId: task.framework_id, taskId: task.id };
    return el('div', { class: 'log-links' },
      el('button', { type: 'button', class: 'log-link', data: { ...data, file: 'stdout' } }, 'stdout'),
      el('button', { type: 'button', class: 'log-link', data: { ...data, file: 'stderr' } }, 'stderr'));
  }

  function names() {
    const done = state.completed_frameworks || [];
    const fw = new Map([...done, ...state.frameworks].map((f) => [f.id, f.name]));
    const ag = new Map(state.agents.map((a) => [a.id, a.hostname]));
    return { fw: (id) => fw.get(id) || id, host: (id) => ag.get(id) || '' };
  }

  // An agent by host name and id: two agents on one machine share the host name.
  function agentCell(hostname, agentId) {
    return hostname ? idLine(hostname, agentId) : idLine(agentId || '—');
  }

  function taskName(t) {
    return t.name && t.name !== t.id ? t.name : '';
  }

  function renderTasks() {
    const n = names();
    const list = state.tasks.slice(0, MAX_TASK_ROWS);
    $('tasks-count').textContent = state.tasks.length ? `${state.tasks.length}` : '';
    const rows = list.map((t) => {
      const framework = n.fw(t.framework_id);
      const host = n.host(t.agent_id);
      return row([t, framework, host], () => el('tr', {
        data: { taskId: t.id, state: shortState(t.state) },
      },
      el('td', {}, idLine(t.id, taskName(t))),
      el('td', {}, framework),
      el('td', {}, agentCell(host, t.agent_id)),
      el('td', { class: 'task-state' }, stateBadge(t.state), preemptingBadge(t)),
      el('td', { class: 'res' }, fmtRes(t.resources)),
      el('td', { class: 'res usage' }, taskUsage(t)),
      el('td', {}, logButtons(t))));
    });
    const more = state.tasks.length - list.length;
    if (more > 0) {
      rows.push(row(['more', more], () => el('tr', { class: 'empty' },
        el('td', { colspan: 7 }, `… and ${more} more`))));
    }
    fillTable('tasks', rows, 'No tasks are running.');
  }

  function renderEnded() {
    const n = names();
    const list = state.completed_tasks || [];
    fillTable('ended', list.map((t) => {
      const framework = n.fw(t.framework_id);
      const host = n.host(t.agent_id);
      return row([t, framework, host], () => {
        let how = t.message || '';
        if (t.exit_code !== null && t.exit_code !== undefined && !how.includes('status')) {
          how = `${how ? `${how}, ` : ''}exit ${t.exit_code}`;
        }
        return el('tr', { data: { taskId: t.id, state: shortState(t.state) } },
          el('td', {}, idLine(t.id, taskName(t))),
          el('td', {}, framework),
          el('td', {}, agentCell(host, t.agent_id)),
          el('td', { class: 'task-state' }, stateBadge(t.state)),
          el('td', { class: 'message', title: t.reason || '' },
            idLine(how || '—', t.reason || '')),
          el('td', {}, fmtClock(t.ended_at)),
          el('td', {}, logButtons(t)));
      });
    }), 'No task has ended yet.');
  }

  // The built-in jobs and services (`mesolite run`); absent from an older master's state.
  function workloadStatus(w) {
    const kind = { active: 'ok', completed: 'done', failed: 'bad', stopped: 'warn' }[w.status];
    const status = badge(w.status, `state ${kind || 'info'}`);
    if (!w.message) return status;
    return el('span', { title: w.message }, status, ' ', el('span', { class: 'sub' }, w.message));
  }

  function renderJobs() {
    const list = state.jobs || [];
    $('jobs-count').textContent = list.length ? `${list.length}` : '';
    fillTable('jobs', list.map((j) => row(j, () => {
      const done = j.completions ? j.succeeded / j.completions : 0;
      return el('tr', { data: { job: j.name, status: j.status } },
        el('td', { title: `each task: ${fmtRes(j.resources)}` },
          idLine(j.name, `role ${j.role} · ${j.parallelism} at once`)),
        el('td', { class: 'job-progress' }, meter(done, `${j.succeeded}/${j.completions}`)),
        el('td', { class: 'num' }, `${j.running}`),
        el('td', { class: 'num', title: (j.failed_indices || []).join(', ') }, `${j.failed}`),
        el('td', { class: 'num', title: `at most ${j.retries} per index` }, `${j.retried}`),
        el('td', { class: 'workload-status' }, workloadStatus(j)));
    })), 'No jobs: submit one with mesolite run FILE.');
  }

  function renderServices() {
    const list = state.services || [];
    $('services-count').textContent = list.length ? `${list.length}` : '';
    fillTable('services', list.map((v) => row(v, () => {
      const up = v.instances ? v.running / v.instances : 0;
      return el('tr', { data: { service: v.name, status: v.status } },
        el('td', { title: `each instance: ${fmtRes(v.resources)}` },
          idLine(v.name, `role ${v.role} · restart ${v.restart_policy}`)),
        el('td', { class: 'service-instances' }, meter(up, `${v.running}/${v.instances}`)),
        el('td', { class: 'num' }, `${v.restarts}`),
        el('td', { class: 'workload-status' }, workloadStatus(v)));
    })), 'No services: submit one with mesolite run FILE.');
  }

  function renderCompleted() {
    const list = state.completed_frameworks || [];
    $('completed-count').textContent = list.length ? `${list.length}` : '';
    fillTable('completed', list.map((f) => row([f], () => {
      const counts = Object.entries(f.tasks_by_state || {}).sort((a, b) => b[1] - a[1]);
      const tasks = counts.map(([s, k]) => `${k} ${shortState(s).toLowerCase()}`).join(', ');
      return el('tr', { data: { frameworkId: f.id } },
        el('td', {}, idLine(f.name, f.id)),
        el('td', {}, f.role),
        el('td', {}, fmtClock(f.ended_at)),
        el('td', {}, tasks || '—'),
        el('td', { class: 'message' }, f.reason || '—'));
    })), 'No framework has ended yet.');
  }

  function render() {
    renderHeader();
    renderSummary();
    renderFrameworks();
    renderAgents();
    renderJobs();
    renderServices();
    renderRoles();
    renderTasks();
    renderEnded();
    renderCompleted();
  }

  // History and charts ---------------------------------------------------------

  function sample() {
    if (!state || !connected) return;
    const c = state.cluster;
    const share = (n) => (c.total[n] > 0 ? (c.allocated[n] || 0) / c.total[n] : 0);
    const shares = {};
    for (const f of state.frameworks) {
      colorOf(f.id, f.name);
      shares[f.id] = f.dominant_share;
    }
    const now = Date.now();
    history.push({ t: now, cpus: share('cpus'), mem: share('mem'), shares });
    while (history.length && history[0].t < now - HISTORY_MS) history.shift();
  }

  function niceStep(spanSeconds) {
    for (const step of [5, 10, 15, 30, 60, 120, 300]) {
      if (spanSeconds / step <= 6) return step;
    }
    return 600;
  }

  function drawChart(node, series) {
    const box = node.getBoundingClientRect();
    const w = Math.max(Math.round(box.width), 200);
    const h = Math.max(Math.round(box.height), 120);
    node.setAttribute('viewBox', `0 0 ${w} ${h}`);
    const m = { l: 40, r: 10, t: 8, b: 22 };
    const pw = w - m.l - m.r;
    const ph = h - m.t - m.b;
    const now = Date.now();
    const first = history.length ? history[0].t : now;
    const span = Math.min(Math.max(now - first, MIN_SPAN_MS), HISTORY_MS);
    const start = now - span;
    const x = (t) => m.l + ((t - start) / span) * pw;
    const yOf = (v) => m.t + (1 - Math.min(Math.max(v, 0), 1)) * ph;
    const parts = [];
    for (const v of [0, 0.25, 0.5, 0.75, 1]) {
      parts.push(svg('line', { class: 'grid', x1: m.l, x2: w - m.r, y1: yOf(v), y2: yOf(v) }));
      const label = svg('text', { class: 'axis', x: m.l - 6, y: yOf(v) + 4, 'text-anchor': 'end' });
      label.textContent = `${v * 100}%`;
      parts.push(label);
    }
    const step = niceStep(span / 1000);
    for (let k = 0; k * step * 1000 <= span; k++) {
      const tx = x(now - k * step * 1000);
      const label = svg('text', {
        class: 'axis', x: tx, y: h - 6, 'text-anchor': k === 0 ? 'end' : 'middle',
      });
      label.textContent = k === 0 ? 'now' : `−${fmtDuration(k * step)}`;
      parts.push(label, svg('line', { class: 'tick', x1: tx, x2: tx, y1: m.t + ph, y2: m.t + ph + 4 }));
    }
    series.forEach((s, index) => {
      // Lines at the same value (DRF's goal!) are drawn side by side, not on top.
      const nudge = s.fill ? 0 : (index - (series.length - 1) / 2) * 2;
      const y = (v) => yOf(v) + nudge;
      // A step line: a value holds until the next sample; gaps where undefined.
      let d = '';
      let area = '';
      let open = false;
      let lastX = 0;
      let startX = 0;
      for (let i = 0; i < history.length; i++) {
        const v = s.value(history[i]);
        const px = x(history[i].t).toFixed(1);
        if (v === undefined) {
          if (open && s.fill) area += `H${lastX}V${y(0)}H${startX}Z`;
          open = false;
          continue;
        }
        const py = y(v).toFixed(1);
        if (!open) {
          d += `M${px},${py}`;
          area += `M${px},${py}`;
          startX = px;
          open = true;
        } else {
          d += `H${px}V${py}`;
          area += `H${px}V${py}`;
        }
        lastX = px;
      }
      if (open) {
        const endX = x(now).toFixed(1);
        d += `H${endX}`;
        area += `H${endX}V${y(0)}H${startX}Z`;
      }
      if (!d) return;
      if (s.fill) {
        const fill = svg('path', { class: 'area', d: area, fill: s.color });
        parts.push(fill);
      }
      parts.push(svg('path', { class: 'series', d, stroke: s.color, 'data-series': s.name }));
    });
    node.replaceChildren(...parts);
  }

  function legend(node, items) {
    node.replaceChildren(...items.map(({ name, color, value }) => {
      const swatch = el('span', { class: 'swatch' });
      swatch.style.background = color;
      return el('span', { class: 'legend-item' }, swatch, name,
        el('span', { class: 'legend-value' }, value));
    }));
  }

  function renderCharts() {
    const latest = history.length ? history[history.length - 1] : null;
    const current = new Set(state ? state.frameworks.map((f) => f.id) : []);
    const shown = [...frameworks.entries()].filter(([id]) =>
      current.has(id) || history.some((h) => h.shares[id] !== undefined));
    drawChart($('share-chart'), shown.map(([id, f]) => ({
      name: f.name, color: f.color, value: (h) => h.shares[id],
    })));
    legend($('share-legend'), shown.length
      ? shown.map(([id, f]) => ({
        name: f.name,
        color: f.color,
        value: latest && latest.shares[id] !== undefined ? pct(latest.shares[id]) : 'gone',
      }))
      : [{ name: 'no frameworks yet', color: '#ced4da', value: '' }]);
    const cluster = [
      { name: 'CPUs', color: '#2563eb', value: (h) => h.cpus, fill: true },
      { name: 'Memory', color: '#e8590c', value: (h) => h.mem, fill: true },
    ];
    drawChart($('cluster-chart'), cluster);
    legend($('cluster-legend'), cluster.map((s) => ({
      name: s.name, color: s.color, value: latest ? pct(s.value(latest)) : '—',
    })));
  }

  let chartsQueued = false;
  function queueCharts() {
    if (chartsQueued) return;
    chartsQueued = true;
    requestAnimationFrame(() => {
      chartsQueued = false;
      renderCharts();
    });
  }

  // Task output ------------------------------------------------------------------

  const viewer = {
    task: null, // {agentId, frameworkId, taskId}
    file: 'stdout',
    timer: null,
    loading: false,
    shown: null, // the text on screen
  };

  function sandboxUrl(t, file) {
    const enc = encodeURIComponent;
    return `agents/${enc(t.agentId)}/sandbox/${enc(t.frameworkId)}/${enc(t.taskId)}/${file}` +
      `?length=${LOG_BYTES}`;
  }

  async function loadLog() {
    if (!viewer.task || viewer.loading) return;
    viewer.loading = true;
    const task = viewer.task;
    const file = viewer.file;
    const out = $('log-output');
    const info = $('log-info');
    try {
      const response = await fetch(sandboxUrl(task, file), { cache: 'no-store' });
      const text = await response.text();
      if (viewer.task !== task || viewer.file !== file) return; // switched meanwhile
      if (!response.ok) {
        info.textContent = `${response.status}: ${text.trim() || response.statusText}`;
        info.classList.add('error');
        return;
      }
      info.classList.remove('error');
      const size = Number(response.headers.get('X-Sandbox-Size') || text.length);
      const offset = Number(response.headers.get('X-Sandbox-Offset') || 0);
      info.textContent = offset > 0
        ? `last ${fmtBytes(size - offset)} of ${fmtBytes(size)}`
        : fmtBytes(size);
      if (text !== viewer.shown) {
        const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
        out.textContent = text || `(${file} is empty)`;
        out.classList.toggle('muted', !text);
        viewer.shown = text;
        if (atBottom) out.scrollTop = out.scrollHeight;
      }
    } catch (err) {
      info.textContent = `could not read ${file}: ${err}`;
      info.classList.add('error');
    } finally {
      viewer.loading = false;
    }
  }

  function fmtBytes(n) {
    if (n >= 1024 * 1024) return `${(n / (1024 * 1024)).toFixed(1)} MiB`;
    if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
    return `${n} bytes`;
  }

  function openLog(task, file) {
    viewer.task = task;
    viewer.file = file;
    viewer.shown = null;
    const host = state ? names().host(task.agentId) : '';
    const on = host ? `${host} (${task.agentId})` : task.agentId;
    $('log-title').replaceChildren(el('strong', {}, task.taskId),
      el('span', { class: 'sub' }, ` on ${on}`));
    for (const tab of document.querySelectorAll('#log-viewer .tab')) {
      tab.classList.toggle('active', tab.dataset.file === file);
    }
    $('log-output').textContent = 'loading…';
    $('log-info').textContent = '';
    $('log-viewer').hidden = false;
    document.body.classList.add('with-log');
    loadLog();
    if (viewer.timer === null) {
      viewer.timer = setInterval(() => {
        if ($('log-follow').checked) loadLog();
      }, 1500);
    }
  }

  function closeLog() {
    viewer.task = null;
    $('log-viewer').hidden = true;
    document.body.classList.remove('with-log');
    if (viewer.timer !== null) clearInterval(viewer.timer);
    viewer.timer = null;
  }

  document.addEventListener('click', (event) => {
    const link = event.target.closest('button.log-link');
    if (link) {
      const { agentId, frameworkId, taskId, file } = link.dataset;
      openLog({ agentId, frameworkId, taskId }, file);
      return;
    }
    const tab = event.target.closest('#log-viewer .tab');
    if (tab && viewer.task) openLog(viewer.task, tab.dataset.file);
  });
  $('log-close').addEventListener('click', closeLog);
  document.addEventListener('keydown', (event) => {
    if (event.key === 'Escape' && viewer.task) closeLog();
  });

  // Live updates -------------------------------------------------------------------

  function setLive(status, text) {
    connected = status === 'live';
    $('live').dataset.status = status;
    $('live-text').textContent = text;
  }

  function connect() {
    const events = new EventSource('events');
    events.addEventListener('open', () => setLive('live', 'live'));
    events.addEventListener('error', () => {
      if (events.readyState === EventSource.CLOSED) {
        setLive('down', 'disconnected');
        setTimeout(connect, 3000);
      } else {
        setLive('down', 'reconnecting…');
      }
    });
    events.addEventListener('state', (event) => {
      state = JSON.parse(event.data);
      setLive('live', 'live');
      sample();
      render();
      queueCharts();
    });
  }

  setInterval(() => {
    sample();
    renderHeader();
    queueCharts();
  }, SAMPLE_MS);
  window.addEventListener('resize', queueCharts);
  connect();
})();
