"""Plots of a `make bench` run (PNG and SVG, into RESULTS/plots/):

- clients_<dataset>: throughput, p50 and p99 latency versus the number of
  client connections (wrk), one line per server, whiskers min-max over rounds
- hist_<workload>_<dataset>: the latency histogram of each server (all
  rounds merged), one panel per server, the floor's in grey behind
- bars_<workload>: time per object (serial workloads) or commits/s, per
  server and dataset: median bar, min-max whisker, n in the label
- ratios: how many times faster than the reference server (runzeo with the
  same marshalling), per workload and dataset: median, min-max over rounds

Needs matplotlib (requirements-bench.txt).
"""
import os
import statistics
import sys

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import latency  # noqa: E402

COLORS = {'zodbd-Z': '#1f4e9c', 'zodbd-M': '#6fa0e8', 'runzeo-Z': '#d2691e',
          'runzeo-M': '#f4b183', 'floor': '#7f7f7f', 'floor-bound': '#3d3d3d', 'zodbd-neo': '#2e8b57',
          'zodbd-neo-nosha1': '#9acd32', 'neo-py': '#8fbc8f', 'zodbd-neo-sqlite': '#9b2d9b'}
# For servers without a colour of their own: none of COLORS' colours, so
# that no two servers of a plot share one.
PALETTE = ['#c0392b', '#8c564b', '#e377c2', '#17becf', '#bcbd22', '#ff7f0e']


def color(server, order):
    if server in COLORS:
        return COLORS[server]
    return PALETTE[order.index(server) % len(PALETTE)] if server in order else '#333333'


def fmt_time(ns, _pos=None):
    for unit, div in (('s', 1e9), ('ms', 1e6), ('µs', 1e3)):
        if ns >= div:
            return '%.3g %s' % (ns / div, unit)
    return '%.3g ns' % ns


def fmt_rate(x, _pos=None):
    if x >= 1e6:
        return '%.3gM' % (x / 1e6)
    if x >= 1e3:
        return '%.3gk' % (x / 1e3)
    return '%.3g' % x


def log_axis(axis, fmt):
    """A log axis labelled 1-2-5 with fmt, no minor labels."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(fmt))
    axis.set_minor_formatter(NullFormatter())


def save(fig, outdir, name, made):
    d = os.path.join(outdir, 'plots')
    os.makedirs(d, exist_ok=True)
    for ext in ('png', 'svg'):
        p = os.path.join(d, '%s.%s' % (name, ext))
        # SVG text stays text (not glyph outlines): files a third the size,
        # small enough to keep in docs/.
        with plt.rc_context({'svg.fonttype': 'none'}):
            fig.savefig(p, dpi=130 if ext == 'png' else None, bbox_inches='tight', metadata=None
                        if ext == 'png' else {'Date': None})
        made.append(p)
    plt.close(fig)


def series(recs, workload, dataset, server, metric):
    """{clients: [values over rounds]}"""
    out = {}
    for r in recs:
        if r['workload'] == workload and r['dataset'] == dataset and r['server'] == server:
            v = r['metrics'].get(metric)
            if v is not None:
                out.setdefault(r['clients'], []).append(v)
    return out


def whisker(vals):
    m = statistics.median(vals)
    return m, m - min(vals), max(vals) - m


def subtitle(meta):
    env = meta.get('env', {})
    s = '%s, %s CPUs online, %s' % (env.get('cpu', '?'), env.get('cpus-online', '?'), meta.get('started', ''))
    if meta.get('pin'):
        s += ', pinned (server %s, load %s)' % (meta.get('server_cpus'), meta.get('load_cpus'))
    return s


def plot_clients(outdir, meta, recs, order, made):
    for ds in meta['datasets']:
        servers = [s for s in order if series(recs, 'wrk', ds, s, 'ops/s')]
        if not servers:
            continue
        fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.6), layout='constrained')
        for s in servers:
            c = color(s, order)
            for ax, metric in ((ax1, 'ops/s'), (ax2, 'p50-ns'), (ax3, 'p99-ns')):
                ser = series(recs, 'wrk', ds, s, metric)
                xs = sorted(ser)
                if not xs:
                    continue
                m = [whisker(ser[x]) for x in xs]
                ax.errorbar(xs, [v[0] for v in m], yerr=[[v[1] for v in m], [v[2] for v in m]],
                            color=c, marker='o', capsize=3, label=s)
        for ax in (ax1, ax2, ax3):
            ax.set_xscale('log', base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: '%d' % x))
            ax.set_xlabel('client connections (one request in flight each)')
            ax.grid(True, which='both', alpha=0.3)
        ax1.set_ylabel('loads per second (higher is better)')
        ax1.yaxis.set_major_formatter(FuncFormatter(fmt_rate))
        ax1.set_ylim(bottom=0)
        for ax, lab in ((ax2, 'p50'), (ax3, 'p99')):
            ax.set_yscale('log')
            ax.set_ylabel('%s latency (lower is better)' % lab)
            log_axis(ax.yaxis, fmt_time)
        ax1.legend(fontsize=8)
        note = '' if any(s != 'floor' for s in servers) else ' — servers not measured (no `zodbd wrk`): the floor only'
        fig.suptitle('%s: throughput and latency vs clients%s\n%s' % (ds, note, subtitle(meta)), fontsize=10)
        save(fig, outdir, 'clients_%s' % ds, made)


def merged_hist(recs, workload, ds, server, clients=None):
    """All rounds' histograms, re-binned to 1/16 of a power of two (the
    tools' own buckets may be finer), so that servers compare bin by bin."""
    h = {}
    for r in recs:
        if r['workload'] == workload and r['dataset'] == ds and r['server'] == server and r.get('hist') \
                and (clients is None or r['clients'] == clients):
            for lo, hi, n in r['hist']:
                b = latency.bucket(int(lo))
                h[b] = h.get(b, 0) + n
    return sorted((lo, hi, n) for (lo, hi), n in h.items())


def pct_of(hist, p):
    total = sum(n for _, _, n in hist)
    acc = 0
    for lo, hi, n in hist:
        acc += n
        if acc >= p * total:
            return (lo + hi) / 2
    return None


def plot_hists(outdir, meta, recs, order, made):
    for w, clients, label in (('pyload', None, 'Python client loadBefore (serial)'),
                              ('wrk', 1, 'wrk -c 1 (Go client, serial)'),
                              ('commit', 16, 'commit latency, 16 committers'),
                              ('commit', 1, 'commit latency, 1 committer'),
                              ('gocommit', 16, 'commit latency, 16 Go committers'),
                              ('gocommit', 1, 'commit latency, 1 Go committer')):
        for ds in meta['datasets']:
            servers = [s for s in order if merged_hist(recs, w, ds, s, clients)]
            if not servers or servers == ['floor']:
                continue
            floor = merged_hist(recs, w, ds, 'floor', clients)
            panels = [s for s in servers if s != 'floor']
            fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.7 * len(panels) + 1.2), sharex=True,
                                     squeeze=False, layout='constrained')
            for ax, s in zip(axes[:, 0], panels):
                h = merged_hist(recs, w, ds, s, clients)
                tot = sum(n for _, _, n in h)
                if floor:
                    ftot = sum(n for _, _, n in floor)
                    ax.fill_between([lo for lo, _, _ in floor], [n / ftot * 100 for _, _, n in floor],
                                    step='post', color='#bbbbbb', alpha=0.6, label='floor')
                ax.fill_between([lo for lo, _, _ in h], [n / tot * 100 for _, _, n in h], step='post',
                                color=color(s, order), alpha=0.8, label=s)
                marks = []
                for p, ls in ((0.5, '-'), (0.99, ':')):
                    v = pct_of(h, p)
                    if v:
                        ax.axvline(v, color='black', linestyle=ls, linewidth=0.8)
                        marks.append('p%d %s' % (p * 100, fmt_time(v)))
                if floor:
                    marks.append('floor p50 %s' % fmt_time(pct_of(floor, 0.5)))
                ax.text(0.01, 0.92, '   '.join(marks) + '   (%d calls)' % tot, transform=ax.transAxes,
                        fontsize=8, va='top')
                ax.set_ylabel('% of calls', fontsize=8)
                ax.legend(loc='upper right', fontsize=8)
                ax.grid(True, axis='x', which='both', alpha=0.3)
                ax.set_xscale('log')
                log_axis(ax.xaxis, fmt_time)
            lo_x = min(pct_of(merged_hist(recs, w, ds, s, clients), 0.001) for s in servers)
            hi_x = max(pct_of(merged_hist(recs, w, ds, s, clients), 0.999) for s in servers)
            axes[-1, 0].set_xlim(lo_x / 1.3, hi_x * 1.5)
            axes[-1, 0].set_xlabel('latency of one call (log scale; buckets 1/16 of a power of two; '
                                   '0.1%–99.9% shown)')
            fig.suptitle('%s — %s, all rounds\n%s' % (ds, label, subtitle(meta)), fontsize=10)
            save(fig, outdir, 'hist_%s%s_%s' % (w, '' if clients is None else clients, ds), made)


def plot_bars(outdir, meta, recs, order, made):
    for w, metric, ylabel, fmt in (('pyload', 'ns/op', 'time per object (lower is better)', fmt_time),
                                   ('hash', 'ns/op', 'time per object (lower is better)', fmt_time),
                                   ('commit', 'commits/s', 'commits per second (higher is better)', fmt_rate),
                                   ('gocommit', 'commits/s', 'commits per second, Go committers (higher is better)',
                                    fmt_rate)):
        groups = []
        for ds in meta['datasets']:
            for c in sorted({r['clients'] for r in recs if r['workload'] == w and r['dataset'] == ds}):
                groups.append((ds, c))
        servers = [s for s in order if any(series(recs, w, ds, s, metric) for ds, _ in groups)]
        if not groups or not servers:
            continue
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) * len(servers) / 2), 4.5), layout='constrained')
        width = 0.8 / len(servers)
        for i, s in enumerate(servers):
            xs, ys, lo, hi, ns = [], [], [], [], []
            for g, (ds, c) in enumerate(groups):
                v = series(recs, w, ds, s, metric).get(c)
                if not v:
                    continue
                m, a, b = whisker(v)
                xs.append(g + (i - (len(servers) - 1) / 2) * width)
                ys.append(m)
                lo.append(a)
                hi.append(b)
                ns.append(len(v))
            bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, color=color(s, order), label=s)
            for b, y, h in zip(bars, ys, hi):
                ax.annotate(fmt(y), (b.get_x() + b.get_width() / 2, y + h), fontsize=7, ha='center',
                            va='bottom', xytext=(0, 2), textcoords='offset points')
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(['%s\n%s' % (ds, ('%d committers' % c) if w in ('commit', 'gocommit') else '') for ds, c in groups],
                           fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        ax.yaxis.set_major_formatter(FuncFormatter(fmt))
        ax.grid(True, axis='y', alpha=0.3)
        ax.legend(fontsize=8)
        nr = sorted({len(series(recs, w, ds, s, metric).get(c, [])) for ds, c in groups for s in servers} - {0})
        ax.set_title('%s: median of %s runs, whiskers min–max\n%s' % (
            w, '/'.join(map(str, nr)), subtitle(meta)), fontsize=10)
        save(fig, outdir, 'bars_%s' % w, made)


def plot_ratios(outdir, meta, recs, order, variants, made):
    from run import baseline_of
    rows = []
    rr = {}
    for r in recs:
        rr.setdefault((r['workload'], r['dataset'], r['clients'], r['server']), {})[r['round']] = r['metrics']
    metric_of = {'hash': ('ns/op', False), 'pyload': ('ns/op', False), 'wrk': ('ops/s', True),
                 'commit': ('commits/s', True), 'gocommit': ('commits/s', True)}
    for (w, ds, c, s), byr in sorted(rr.items(), key=lambda kv: (list(metric_of).index(kv[0][0]), kv[0][1], kv[0][2])):
        ref = baseline_of(s, variants, meta.get('sched'), order)
        if not ref or ref == s or (w, ds, c, ref) not in rr:
            continue
        m, higher = metric_of[w]
        refr = rr[(w, ds, c, ref)]
        vals = [(byr[k][m] / refr[k][m]) if higher else (refr[k][m] / byr[k][m])
                for k in sorted(set(byr) & set(refr)) if byr[k].get(m) and refr[k].get(m)]
        if vals:
            rows.append(('%s %s%s — %s vs %s' % (w, ds, ' c=%d' % c if w in ('wrk', 'commit', 'gocommit') else '', s, ref),
                         s, vals))
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.5), layout='constrained')
    ys = range(len(rows))[::-1]
    for y, (label, s, vals) in zip(ys, rows):
        m, a, b = whisker(vals)
        ax.barh(y, m, xerr=[[a], [b]], capsize=3, color=color(s, order), height=0.7)
        ax.annotate('%.2f×' % m, (m + b, y), fontsize=7, va='center', xytext=(4, 0), textcoords='offset points')
    ax.axvline(1.0, color='black', linewidth=0.8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.set_xlabel('times faster than the reference (median over rounds; whiskers min–max; 1 = same)')
    ax.grid(True, axis='x', alpha=0.3)
    ax.set_title('Speed-up against the reference\n%s' % subtitle(meta), fontsize=10)
    save(fig, outdir, 'ratios', made)


# The targets of the issues (docs: BENCHMARKS.md): speed-ups against
# runzeo with the same marshalling (at least), and serial loads against
# the bare ping-pong floor (at most).
TARGET_SPEEDUPS = [('pyload', None, 1.4, 'Python client, serial'), ('wrk', 16, 3.0, '16 connections'),
                   ('gocommit', 16, 3.0, '16 committers')]
TARGET_FLOOR = 1.3


def per_round(rr, key, ref, metric, higher):
    """Per-round ratios of rr[key] against rr[ref] (>1: key is faster)."""
    a, b = rr.get(key, {}), rr.get(ref, {})
    return [(a[k][metric] / b[k][metric]) if higher else (b[k][metric] / a[k][metric])
            for k in sorted(set(a) & set(b)) if a[k].get(metric) and b[k].get(metric)]


def plot_targets(outdir, meta, recs, order, made):
    """targets: the figures the issues set targets for, beside the targets:
    zodbd-Z's speed-up over runzeo-Z (left) and the serial load's time
    against the floor (right)."""
    rr = {}
    for r in recs:
        rr.setdefault((r['workload'], r['dataset'], r['clients'], r['server']), {})[r['round']] = r['metrics']
    datasets = sorted({k[1] for k in rr}, key=lambda d: (not d.startswith('prod1-1024'), d))
    left = []
    for w, c, target, what in TARGET_SPEEDUPS:
        m = 'ns/op' if w == 'pyload' else ('ops/s' if w == 'wrk' else 'commits/s')
        for ds in datasets:
            keys = [k for k in rr if k[0] == w and k[1] == ds and k[3] == 'zodbd-Z' and (c is None or k[2] == c)]
            for k in keys:
                vals = per_round(rr, k, k[:3] + ('runzeo-Z',), m, m != 'ns/op')
                if vals:
                    left.append(('%s, %s' % (what, ds), vals, target))
    right = []
    for ds in datasets:
        for s in ('zodbd-Z', 'zodbd-neo', 'runzeo-Z'):
            k = ('hash', ds, 1, s)
            if k not in rr:
                k = next((x for x in rr if x[0] == 'hash' and x[1] == ds and x[3] == s), None)
            if k is None:
                continue
            vals = per_round(rr, k[:3] + ('floor',), k, 'ns/op', False)
            if vals:
                right.append(('%s, %s' % (s, ds), s, vals))
    if not left and not right:
        return
    n = max(len(left), len(right), 1)
    fig, axs = plt.subplots(1, 2, figsize=(11, 0.34 * n + 1.8), layout='constrained')
    ax = axs[0]
    ys = range(len(left))[::-1]
    for y, (label, vals, target) in zip(ys, left):
        m, a, b = whisker(vals)
        # "met" only when every round reached the target, not just the median
        ok = min(vals) >= target
        ax.barh(y, m, xerr=[[a], [b]], capsize=3, color=color('zodbd-Z', order), height=0.65)
        ax.plot([target, target], [y - 0.42, y + 0.42], color='#c0392b', linewidth=2)
        ax.annotate('%.2f× (target %.1f×: %s)' % (m, target, 'met' if ok else 'not in every round'), (m + b, y),
                    fontsize=7,
                    va='center', xytext=(4, 0), textcoords='offset points')
    ax.axvline(1.0, color='black', linewidth=0.8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r[0] for r in left], fontsize=8)
    ax.set_xlim(0, max([whisker(v)[0] + whisker(v)[2] for _, v, _ in left] + [3.5]) * 1.25)
    ax.set_xlabel('zodbd-Z vs runzeo-Z, times faster\n(bar: median; whiskers: min–max; red: target)', fontsize=8)
    ax.grid(True, axis='x', alpha=0.3)
    ax = axs[1]
    ys = range(len(right))[::-1]
    for y, (label, s, vals) in zip(ys, right):
        m, a, b = whisker(vals)
        ax.barh(y, m, xerr=[[a], [b]], capsize=3, color=color(s, order), height=0.65)
        ax.annotate('%.2f×' % m, (m + b, y), fontsize=7, va='center', xytext=(4, 0), textcoords='offset points')
    ax.axvline(1.0, color='black', linewidth=0.8)
    ax.axvline(TARGET_FLOOR, color='#c0392b', linewidth=1.5, linestyle='--')
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r[0] for r in right], fontsize=8)
    ax.set_xlabel('serial load (Go client) time × bare TCP ping-pong\n(lower is better; dashed: target %.1f×)'
                  % TARGET_FLOOR, fontsize=8)
    ax.grid(True, axis='x', alpha=0.3)
    fig.suptitle('Against the targets\n%s' % subtitle(meta), fontsize=10)
    save(fig, outdir, 'targets', made)


def make_all(outdir, meta, recs, variants):
    order = [s for s in meta['servers'] if s in variants]
    made = []
    plot_bars(outdir, meta, recs, order, made)
    plot_ratios(outdir, meta, recs, order, variants, made)
    plot_targets(outdir, meta, recs, order, made)
    plot_clients(outdir, meta, recs, order, made)
    plot_hists(outdir, meta, recs, order, made)
    return made
