// mintgate's dashboard: polls /api/state every second and redraws.
// No library and nothing fetched from elsewhere: charts are inline SVG.
'use strict';

const $ = (id) => document.getElementById(id);
const SVG = 'http://www.w3.org/2000/svg';
let updates = 0;
let prev = null; // the previous state, for rates of counters

function fmt(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '–';
  const a = Math.abs(n);
  if (a >= 1e6) return (n / 1e6).toFixed(2) + 'M';
  if (a >= 1e4) return (n / 1e3).toFixed(1) + 'k';
  if (a >= 100 || Number.isInteger(n)) return Math.round(n).toString();
  return n.toFixed(1);
}

// A figure: shown formatted, its exact value kept in data-raw (read by tests).
function show(id, raw, text, t) {
  const e = $(id);
  e.dataset.raw = String(raw);
  if (t !== undefined) e.dataset.t = String(t);
  e.textContent = text === undefined ? fmt(raw) : text;
}

function el(tag, attrs, text) {
  const e = tag.startsWith('svg:') ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

// Line chart of series [{values, color, axis: 'left'|'right', step}], x = seconds.
function chart(svg, xs, series) {
  const W = 600, H = 220, L = 48, R = 48, T = 10, B = 24;
  svg.replaceChildren();
  const x0 = xs.length ? xs[0] : 0, x1 = xs.length ? xs[xs.length - 1] : 1;
  const span = Math.max(1, x1 - x0);
  const max = { left: 1, right: 1 };
  for (const s of series) for (const v of s.values) max[s.axis || 'left'] = Math.max(max[s.axis || 'left'], v);
  max.left = niceMax(max.left); max.right = niceMax(max.right);
  const px = (x) => L + ((x - x0) / span) * (W - L - R);
  const py = (v, axis) => T + (1 - v / max[axis]) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const y = T + (i / 4) * (H - T - B);
    svg.append(el('svg:line', { x1: L, x2: W - R, y1: y, y2: y, class: 'grid' }));
    svg.append(el('svg:text', { x: L - 4, y: y + 4, 'text-anchor': 'end' }, fmt(max.left * (1 - i / 4))));
    if (series.some((s) => s.axis === 'right')) {
      svg.append(el('svg:text', { x: W - R + 4, y: y + 4 }, fmt(max.right * (1 - i / 4))));
    }
  }
  svg.append(el('svg:text', { x: L, y: H - 6 }, '-' + Math.round(span) + ' s'));
  svg.append(el('svg:text', { x: W - R, y: H - 6, 'text-anchor': 'end' }, 'now'));
  for (const s of series) {
    const axis = s.axis || 'left';
    let d = '';
    s.values.forEach((v, i) => {
      const x = px(xs[i]).toFixed(1), y = py(v, axis).toFixed(1);
      if (i === 0) d += `M${x},${y}`;
      else if (s.step) d += `H${x}V${y}`;
      else d += `L${x},${y}`;
    });
    if (d) svg.append(el('svg:path', { d, fill: 'none', stroke: s.color, 'stroke-width': s.width || 2, 'stroke-opacity': s.opacity || 1 }));
  }
}

function table(head, rows, numeric) {
  const t = el('table');
  const tr = el('tr');
  head.forEach((h, i) => tr.append(el('th', numeric && numeric[i] ? { class: 'num' } : {}, h)));
  t.append(tr);
  for (const r of rows) {
    const row = el('tr');
    r.forEach((c, i) => row.append(el('td', numeric && numeric[i] ? { class: 'num' } : {}, String(c))));
    t.append(row);
  }
  return t;
}

function notEnabled(id) {
  const e = $(id);
  e.className = 'off';
  e.replaceChildren('not enabled');
}

function renderPipeline(s) {
  const p = s.pipeline;
  const sm = p.samples || [];
  const last = sm[sm.length - 1];
  $('meta').textContent = `v${s.version} · up ${Math.round(s.uptime_s)} s · pool ${p.pool}`;
  if (last) {
    const dt = last.dt || 1;
    show('nr-rate', last.r, fmt(last.r / dt), last.t);
    show('htp-rate', last.h, fmt(last.h / dt), last.t);
    show('drops', last.dropped, fmt(last.dropped / dt), last.t);
  }
  show('threads', p.htp_threads);
  $('pool').textContent = 'pool ' + p.pool +
    (p.batch_threads ? ` · ${p.batch_threads} in SCHED_BATCH` : '');
  show('queue', p.queue_len);
  $('queue-bytes').textContent = `${fmt(p.queue_bytes)} of ${fmt(p.queue_limit_bytes)} bytes`;
  const tot = p.totals;
  const dropped = tot.dropped_non + tot.rejected_con + tot.shed;
  $('drops-total').textContent = `per second · ${fmt(dropped)} in all`;
  show('handled-total', tot.handled);
  let diff = 0;
  for (const x of sm) diff += x.r - x.h;
  $('diff').textContent = `cumulative NR − HTP over the window: ${fmt(diff)}`;
  $('window').textContent = String(sm.length);
  const xs = sm.map((x) => x.t);
  chart($('chart-rates'), xs, [
    { values: sm.map((x) => x.r / (x.dt || 1)), color: 'var(--nr)', width: 5, opacity: 0.45 },
    { values: sm.map((x) => x.h / (x.dt || 1)), color: 'var(--htp)' },
    { values: sm.map((x) => x.dropped / (x.dt || 1)), color: 'var(--bad)', width: 1.5 },
  ]);
  chart($('chart-threads'), xs, [
    { values: sm.map((x) => x.n), color: 'var(--thr)', step: true },
    { values: sm.map((x) => x.qs), color: 'var(--queue)', axis: 'right' },
  ]);
  const v = p.vta;
  $('vta').textContent = v
    ? `P=${v.p_next.toFixed(2)}, NT_max=${v.nt_max}, next N=${v.n_next}${v.saturated ? ', saturated' : ''}`
    : (p.pool === 'vta' ? 'no decision yet' : 'off (fixed pool)');
}

function renderDevices(s) {
  const d = s.devices;
  if (!d) return notEnabled('devices');
  const e = $('devices');
  e.className = '';
  const rows = d.list.map((x) => [
    x.name, x.kind, x.resource,
    x.value === null ? '–' : x.value + (x.unit ? ' ' + x.unit : ''),
    x.updates,
    // a field device's connection: up or down, polls, errors, last error
    x.link
      ? `${x.link.connected ? 'up' : 'down'}, ${x.link.polls} polls, ${x.link.errors} errors`
        + (x.link.last_error ? ` (${x.link.last_error})` : '')
      : '',
  ]);
  const obs = s.observe ? s.observe.observers : 0;
  e.replaceChildren(table(['name', 'kind', 'CoAP resource', 'latest', 'updates', 'link'], rows, [0, 0, 0, 1, 1, 0]),
    el('p', { class: 'legend' }, `${obs} Observe registration(s)`));
}

function renderDirectpath(s) {
  const d = s.directpath;
  if (!d) return notEnabled('directpath');
  const e = $('directpath');
  e.className = '';
  const links = d.links.length
    ? table(['id', 'link'], d.links.map((l) => [l.id, l.text]), [1, 0])
    : el('p', { class: 'off' }, 'no links (add one: POST coap://HOST/links)');
  const us = (v) => (v === null || v === undefined ? '–' : v.toFixed(2) + ' µs');
  const lat = table(['latency', 'p50', 'p99'], [
    ['inside the worker', us(d.worker_p50_us), us(d.worker_p99_us)],
    ['end to end (ring → outputs)', us(d.e2e_p50_us), us(d.e2e_p99_us)],
  ], [0, 1, 1]);
  const counts = el('p', { class: 'legend' },
    `events ${fmt(d.pushed)} · fired ${fmt(d.fired)} · ring overflow ${fmt(d.overflow)} · output errors ${fmt(d.output_errors)} · wait ${d.wait}`);
  if (d.overflow > 0) counts.classList.add('bad');
  e.replaceChildren(links, lat, counts);
}

function rate(cur, old, key, dt) {
  if (!old || !(dt > 0) || old[key] === undefined) return null;
  return Math.max(0, cur[key] - old[key]) / dt;
}

function renderProxy(s) {
  const p = s.proxy;
  if (!p) return notEnabled('proxy');
  const e = $('proxy');
  e.className = '';
  const old = prev && prev.proxy;
  const dt = prev ? (s.now_ms - prev.now_ms) / 1000 : 0;
  const errs = Object.values(p.errors).reduce((a, b) => a + b, 0);
  const cur = { requests: p.requests, errors: errs, cache_hits: p.cache_hits };
  const oldc = old ? { requests: old.requests, errors: Object.values(old.errors).reduce((a, b) => a + b, 0), cache_hits: old.cache_hits } : null;
  const rr = rate(cur, oldc, 'requests', dt), er = rate(cur, oldc, 'errors', dt), cr = rate(cur, oldc, 'cache_hits', dt);
  const rows = [
    ['requests', fmt(rr), fmt(p.requests)],
    ['cache hits', fmt(cr), fmt(p.cache_hits)],
    ['errors', fmt(er), fmt(errs)],
  ];
  for (const [k, v] of Object.entries(p.errors)) if (v > 0) rows.push(['  ' + k.replace(/_/g, ' '), '', fmt(v)]);
  const where = [p.http && 'HTTP/1.1 and HTTP/2 on tcp ' + p.http, p.h3 && 'HTTP/3 on udp ' + p.h3].filter(Boolean).join(' · ');
  const t = table(['', 'per second', 'in all'], rows, [0, 1, 1]);
  t.id = 'proxy-table';
  t.dataset.requests = String(p.requests);
  e.replaceChildren(t, el('p', { class: 'legend' }, where));
}

// The MQTT bridge's section: whatever scalars it reports, with its broker
// state and publish queue depth first.
function renderMqtt(s) {
  const m = s.mqtt;
  if (!m) return notEnabled('mqtt');
  const e = $('mqtt');
  e.className = '';
  const first = ['state', 'broker', 'queue_depth'];
  const keys = first.filter((k) => k in m).concat(Object.keys(m).filter((k) => !first.includes(k)));
  const rows = keys.filter((k) => typeof m[k] !== 'object' || m[k] === null)
    .map((k) => [k.replace(/_/g, ' '), typeof m[k] === 'number' ? fmt(m[k]) : String(m[k])]);
  e.replaceChildren(table(['', ''], rows, [0, 1]));
}

function render(s) {
  renderPipeline(s);
  renderDevices(s);
  renderDirectpath(s);
  renderProxy(s);
  renderMqtt(s);
}

async function poll() {
  const started = performance.now();
  const status = $('status');
  try {
    const r = await fetch('/api/state', { cache: 'no-store' });
    if (!r.ok) throw new Error('HTTP ' + r.status);
    const s = await r.json();
    render(s);
    prev = s;
    updates += 1;
    document.body.dataset.updates = String(updates);
    status.textContent = 'live · ' + new Date(s.now_ms).toLocaleTimeString();
    status.className = 'ok';
  } catch (err) {
    status.textContent = 'no answer: ' + err.message;
    status.className = 'bad';
  }
  setTimeout(poll, Math.max(100, 1000 - (performance.now() - started)));
}

poll();
