// zodbd's live status page: polls status.json once a second and redraws.
// Plain JS on <canvas>, no libraries. For tests, <body> carries
// data-polls (answers received), data-samples (samples held),
// data-last-seq and data-updated (ms of the last answer), and each
// canvas data-draws and data-points (points drawn by its last draw).
'use strict';
(function () {
  var samples = [], state = null, lastSeq = 0, polls = 0, capacity = 600, win = 60;
  var skew = 0; // server time - browser time, ms
  var started = 0; // the server's start (a new one: the server restarted)
  var colors = ['#3b6fd8', '#e3892b', '#2e9e5b', '#b23ac2', '#c62828', '#6b7280'];
  var FIELDS = ['conns', 'reqs', 'p50', 'p90', 'p99', 'loads', 'stores', 'commits', 'aborts', 'conflicts', 'resolved', 'in', 'out', 'queued',
    'cpu', 'cpu_per_req_us'];
  var $ = function (id) { return document.getElementById(id); };

  function fmtNum(v) {
    if (v == null || isNaN(v)) return '–';
    var a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + 'G';
    if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    if (a >= 100 || v === Math.round(v)) return Math.round(v).toString();
    return v.toFixed(a >= 10 ? 1 : 2);
  }
  function fmtBytes(v) {
    if (v == null) return '–';
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(v >= 100 ? 0 : 1) : Math.round(v)) + ' ' + u[i];
  }
  function fmtMs(v) {
    if (!v) return '–';
    if (v >= 1000) return (v / 1000).toFixed(2) + ' s';
    if (v >= 1) return v.toFixed(v >= 100 ? 0 : 1) + ' ms';
    return (v * 1000).toFixed(0) + ' µs';
  }
  function fmtAgo(ms) {
    var s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return s + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    if (s < 86400) return Math.floor(s / 3600) + ' h ago';
    return Math.floor(s / 86400) + ' d ago';
  }
  function fmtDur(ms) {
    var s = Math.floor(ms / 1000), d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
    return (d ? d + 'd ' : '') + (d || h ? h + 'h ' : '') + m + 'm ' + (s % 60) + 's';
  }

  // niceStep returns a round step for about n ticks over span.
  function niceStep(span, n) {
    var raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
  }
  // binStep is niceStep in units of 1024^k (byte axes).
  function binStep(span, n) {
    var u = Math.pow(1024, Math.max(0, Math.floor(Math.log(span / n) / Math.log(1024))));
    return niceStep(span / u, n) * u;
  }

  // plot draws series ({name, color, pts: [[t, v], ...], right}) on canvas
  // over the window [t0, t1]; opts: log (log scale), fmt (y labels),
  // fmtRight and right-axis series (drawn dashed against their own scale).
  function plot(canvas, series, t0, t1, opts) {
    var dpr = window.devicePixelRatio || 1, w = canvas.clientWidth || 600, h = canvas.clientHeight || 190;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
    }
    var g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    g.font = '11px system-ui, sans-serif';
    var T = 18, B = 20, ph = h - T - B, step = opts.bytes ? binStep : niceStep;
    function range(right) {
      var lo = Infinity, hi = -Infinity;
      series.forEach(function (s) {
        if (!!s.right !== right) return;
        s.pts.forEach(function (p) { if (!opts.log || p[1] > 0) { lo = Math.min(lo, p[1]); hi = Math.max(hi, p[1]); } });
      });
      if (hi === -Infinity) { lo = opts.log ? 0.01 : 0; hi = opts.log ? 1 : 1; }
      if (opts.log) { lo = Math.pow(10, Math.floor(Math.log10(lo))); hi = Math.pow(10, Math.ceil(Math.log10(hi))); if (hi <= lo) hi = lo * 10; }
      else { lo = 0; if (hi <= 0) hi = 1; var st = (right ? niceStep : step)(hi, 4); hi = Math.ceil(hi / st) * st; }
      return [lo, hi];
    }
    var yl = range(false), yr = range(true), fmt = opts.fmt || fmtNum;
    var ticks = [], rticks = [];
    if (opts.log) { for (var v = yl[0]; v <= yl[1] * 1.0001; v *= 10) ticks.push(v); }
    else { var st = step(yl[1], 4); for (var v2 = 0; v2 <= yl[1] + st / 2; v2 += st) ticks.push(v2); }
    if (opts.fmtRight) { var str = niceStep(yr[1], 4); for (var v3 = 0; v3 <= yr[1] + str / 2; v3 += str) rticks.push(v3); }
    // The margins fit the longest label.
    var widest = function (ts, f) { return ts.reduce(function (m, v) { return Math.max(m, g.measureText(f(v)).width); }, 0); };
    var L = Math.ceil(widest(ticks, fmt)) + 10, R = opts.fmtRight ? Math.ceil(widest(rticks, opts.fmtRight)) + 10 : 10;
    var pw = w - L - R;
    function Y(v, r) {
      if (opts.log && !r) return T + ph - (Math.log10(Math.max(v, yl[0])) - Math.log10(yl[0])) / (Math.log10(yl[1]) - Math.log10(yl[0])) * ph;
      var rr = r ? yr : yl; return T + ph - (v - rr[0]) / (rr[1] - rr[0]) * ph;
    }
    function X(t) { return L + (t - t0) / (t1 - t0) * pw; }
    // Grid and axes.
    g.strokeStyle = '#e3e7ee'; g.fillStyle = '#69738a'; g.lineWidth = 1; g.textBaseline = 'middle';
    ticks.forEach(function (v) {
      var y = Math.round(Y(v)) + 0.5;
      g.beginPath(); g.moveTo(L, y); g.lineTo(L + pw, y); g.stroke();
      g.textAlign = 'right'; g.fillText(fmt(v), L - 6, y);
    });
    g.textAlign = 'left';
    rticks.forEach(function (v) { g.fillText(opts.fmtRight(v), L + pw + 6, Y(v, true)); });
    g.textAlign = 'center'; g.textBaseline = 'top';
    var span = (t1 - t0) / 1000, xs = span > 300 ? 120 : span > 120 ? 60 : 15;
    for (var s = 0; s <= span; s += xs) {
      var x = X(t1 - s * 1000);
      g.beginPath(); g.moveTo(x, T); g.lineTo(x, T + ph); g.stroke();
      g.fillText(s === 0 ? 'now' : '-' + (s >= 60 ? s / 60 + 'm' : s + 's'), x, T + ph + 5);
    }
    // Lines.
    var drawn = 0;
    g.save(); g.beginPath(); g.rect(L, T, pw, ph); g.clip();
    series.forEach(function (s) {
      g.strokeStyle = s.color; g.lineWidth = 1.6; g.setLineDash(s.right ? [5, 3] : []);
      g.beginPath();
      var pen = false, prevT = 0;
      s.pts.forEach(function (p) {
        if (p[0] < t0 - 2000) return;
        if (opts.log && !(p[1] > 0)) { pen = false; return; }
        var x = X(p[0]), y = Y(p[1], s.right);
        if (pen && p[0] - prevT < 3000) g.lineTo(x, y); else g.moveTo(x, y);
        pen = true; prevT = p[0]; drawn++;
      });
      g.stroke();
    });
    g.restore(); g.setLineDash([]);
    // Legend.
    g.textAlign = 'left'; g.textBaseline = 'middle';
    var lx = L;
    series.forEach(function (s) {
      g.fillStyle = s.color; g.fillRect(lx, 5, 10, 3);
      g.fillStyle = '#1d2433'; g.fillText(s.name, lx + 14, 7);
      lx += 22 + g.measureText(s.name).width;
    });
    canvas.dataset.draws = (+canvas.dataset.draws || 0) + 1;
    canvas.dataset.points = drawn;
  }

  function series(name, color, f, right) {
    var pts = [];
    samples.forEach(function (s) { pts.push([s.t, f(s)]); });
    return { name: name, color: color, pts: pts, right: right };
  }

  function draw() {
    var t1 = Date.now() + skew, t0 = t1 - win * 1000;
    var recent = samples.filter(function (s) { return s.t >= t0; });
    // Requests: the total and the 4 busiest methods of the window.
    var tot = {};
    recent.forEach(function (s) { for (var m in s.methods || {}) tot[m] = (tot[m] || 0) + s.methods[m]; });
    var top = Object.keys(tot).sort(function (a, b) { return tot[b] - tot[a]; }).slice(0, 4);
    var req = [series('all', '#1d2433', function (s) { return s.reqs; })];
    top.forEach(function (m, i) { req.push(series(m, colors[i], function (s) { return (s.methods || {})[m] || 0; })); });
    plot($('p-reqs'), req, t0, t1, {});
    plot($('p-lat'), [
      series('p50', colors[2], function (s) { return s.p50; }),
      series('p90', colors[1], function (s) { return s.p90; }),
      series('p99', colors[4], function (s) { return s.p99; })
    ], t0, t1, { log: true, fmt: fmtMs });
    plot($('p-txn'), [
      series('commits', colors[0], function (s) { return s.commits; }),
      series('aborts', colors[5], function (s) { return s.aborts; }),
      series('conflicts', colors[4], function (s) { return s.conflicts; }),
      series('resolved', colors[2], function (s) { return s.resolved; })
    ], t0, t1, {});
    plot($('p-net'), [
      series('received', colors[0], function (s) { return s.in; }),
      series('sent', colors[1], function (s) { return s.out; }),
      series('clients (right)', colors[3], function (s) { return s.conns; }, true)
    ], t0, t1, { fmt: function (v) { return fmtBytes(v) + '/s'; }, bytes: true, fmtRight: fmtNum });
  }

  function cell(tr, text, cls) {
    var td = document.createElement('td');
    if (text instanceof Node) td.appendChild(text); else td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
  }
  function fill(id, rows, empty, ncols) {
    var tb = $(id).tBodies[0];
    tb.textContent = '';
    if (!rows.length) { var tr = tb.insertRow(); cell(tr, empty, 'none'); tr.cells[0].colSpan = ncols; return; }
    rows.forEach(function (r) {
      var tr = tb.insertRow();
      r.forEach(function (c) { cell(tr, c[0], c[1]); });
    });
  }
  function packCell(p, now) {
    if (!p) return 'idle';
    var span = document.createElement('span'), bar = document.createElement('span'), i = document.createElement('i');
    var f = p.total > 0 && p.phase !== 'install' ? Math.min(1, p.done / p.total) : 0;
    bar.className = 'bar'; i.style.width = (100 * f).toFixed(0) + '%'; bar.appendChild(i);
    span.appendChild(bar);
    span.appendChild(document.createTextNode(p.phase + (p.phase === 'install' ? '' : ' ' + (100 * f).toFixed(0) + '%') + ', ' + fmtDur(now - p.started)));
    return span;
  }

  function render() {
    var last = samples[samples.length - 1], now = Date.now() + skew;
    if (last) {
      $('t-clients').textContent = last.conns;
      $('t-reqs').textContent = fmtNum(last.reqs);
      $('t-p50').textContent = fmtMs(last.p50);
      $('t-p99').textContent = fmtMs(last.p99);
      $('t-commits').textContent = fmtNum(last.commits);
      $('t-conflicts').textContent = fmtNum(last.conflicts);
      $('t-in').textContent = fmtBytes(last.in);
      $('t-out').textContent = fmtBytes(last.out);
      $('t-cpu').textContent = last.cpu ? last.cpu.toFixed(2) : '–';
      $('t-cpureq').textContent = last.cpu_per_req_us ? fmtNum(last.cpu_per_req_us) + ' µs' : '–';
      var ms = Object.keys(last.lat || {}).sort(function (a, b) { return last.methods[b] - last.methods[a]; });
      fill('methods', ms.map(function (m) {
        var l = last.lat[m];
        return [[m], [fmtNum(last.methods[m]), 'num'], [fmtMs(l[0]), 'num'], [fmtMs(l[1]), 'num'], [fmtMs(l[2]), 'num']];
      }), 'no requests in the last second', 5);
    }
    if (!state) return;
    $('proto').textContent = state.protocol === 'neo' ? 'NEO storage node' : 'ZEO server';
    var rd = $('ready');
    rd.textContent = state.ready ? 'ready' : 'not ready';
    rd.className = 'pill ' + (state.ready ? 'ok' : 'bad');
    fill('storages', state.storages.map(function (s) {
      return [[s.name], [fmtNum(s.objects), 'num'], [fmtBytes(s.size), 'num'], [s.index_bytes ? fmtBytes(s.index_bytes) : '–', 'num'],
        [s.last_tid || '–'], [s.last_time ? fmtAgo(now - Date.parse(s.last_time)) : '–'], [fmtNum(s.invalidation_queue), 'num'],
        [fmtNum(s.commits), 'num'], [fmtNum(s.conflicts), 'num'], [fmtNum(s.resolved), 'num'], [packCell(s.pack, now)]];
    }), 'no storage information', 11);
    fill('clients', state.clients.map(function (c) {
      return [[c.label || '(no label)', c.label ? '' : 'none'], [c.n, 'num']];
    }), 'no clients connected', 2);
    var cls = [], oids = [];
    state.storages.forEach(function (s) {
      (s.conflict_classes || []).forEach(function (c) { cls.push([[s.name], [c.name, 'wrap'], [fmtNum(c.n), 'num']]); });
      (s.conflict_oids || []).forEach(function (c) { oids.push([[s.name], [c.name], [fmtNum(c.n), 'num']]); });
    });
    fill('cclasses', cls, 'no conflicts', 3);
    fill('coids', oids, 'no conflicts', 3);
  }

  function update() {
    draw();
    render();
    var b = document.body.dataset;
    b.samples = samples.length;
    b.lastSeq = lastSeq;
  }

  var timer = null;
  function poll() {
    fetch('status.json?since=' + lastSeq, { cache: 'no-store' }).then(function (r) {
      if (!r.ok) throw new Error('HTTP ' + r.status);
      return r.json();
    }).then(function (j) {
      skew = j.now - Date.now();
      capacity = j.capacity || capacity;
      if (started && j.started !== started) { // the server restarted: start over
        started = j.started; samples = []; lastSeq = 0; state = null;
        return;
      }
      started = j.started;
      j.samples.forEach(function (s) {
        FIELDS.forEach(function (k) { s[k] = s[k] || 0; }); // zeros are left out
        if (s.seq > lastSeq) samples.push(s);
        lastSeq = Math.max(lastSeq, s.seq);
      });
      if (samples.length > capacity) samples = samples.slice(samples.length - capacity);
      state = j.state;
      polls++;
      document.body.dataset.polls = polls;
      document.body.dataset.updated = Date.now();
      $('uptime').textContent = 'up ' + fmtDur(j.now - j.started);
      $('sched').textContent = 'GOMAXPROCS ' + j.gomaxprocs + ' of ' + j.cpus + ' CPUs';
      var u = $('updated'); u.textContent = 'updated ' + new Date(j.now).toLocaleTimeString(); u.className = '';
      update();
    }).catch(function (e) {
      var u = $('updated'); u.textContent = 'no answer (' + e.message + '), retrying'; u.className = 'stale';
    }).then(function () { timer = setTimeout(poll, 1000); });
  }

  Array.prototype.forEach.call(document.querySelectorAll('#window button'), function (btn) {
    btn.addEventListener('click', function () {
      win = +btn.dataset.win;
      Array.prototype.forEach.call(document.querySelectorAll('#window button'), function (o) { o.className = o === btn ? 'on' : ''; });
      draw();
    });
  });
  window.addEventListener('resize', draw);
  poll();
})();
