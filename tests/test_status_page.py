"""The live status page of zodbd serve --http-addr, in a real browser.

With load running (zodbd wrk: loads and commits) and conflicts made by the
stock ZEO client, headless Chromium (Debian's package: `make chromium`)
opens http://HTTP-ADDR/; the test checks that the four plots draw, that
they keep updating (two observations 2.5 s apart: new samples, redraws,
lines in the plots' colours on the canvases) and that the tables show
the clients, the storage's last tid and the conflicts by class and by
object. It saves a screenshot (to $ZODBD_STATUS_SCREENSHOT when set: that
is how docs/status-page.png is made)."""
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import transaction
import ZEO
from persistent.mapping import PersistentMapping
from ZODB.POSException import ConflictError
from ZODB.utils import u64

import chromium
from zeoserver import Server, free_port

PLOTS = ['p-reqs', 'p-lat', 'p-txn', 'p-net']

# What the page exposes for tests (status.js): polls, samples, the last
# sample's number, and each canvas's redraws and points drawn.
OBSERVE = '''JSON.stringify({
  polls: +document.body.dataset.polls,
  samples: +document.body.dataset.samples,
  seq: +document.body.dataset.lastSeq,
  draws: %s.map(id => +document.getElementById(id).dataset.draws),
  points: %s.map(id => +document.getElementById(id).dataset.points),
})''' % (json.dumps(PLOTS), json.dumps(PLOTS))

# The pixels of a canvas near an RGB colour (a plotted line's: the legend
# swatch alone is 30 CSS pixels).
PIXELS = '''(() => {
  const c = document.getElementById(%s), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const [r, g, b] = %s;
  let n = 0;
  for (let i = 0; i < d.length; i += 4)
    if (d[i + 3] > 200 && Math.abs(d[i] - r) < 30 && Math.abs(d[i + 1] - g) < 30 && Math.abs(d[i + 2] - b) < 30) n++;
  return n / (window.devicePixelRatio * window.devicePixelRatio);
})()'''


def wait_ready(http):
    for _ in range(200):
        try:
            with urllib.request.urlopen('http://%s/ready' % http, timeout=10) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:
            assert e.code == 503
        time.sleep(0.05)
    pytest.fail('/ready never 200')


def make_conflicts(addr, n):
    """Commits 10 PersistentMappings, then n write conflicts on the first;
    returns its oid."""
    dbs = [ZEO.DB(addr, wait_timeout=10, client_label='status-test')]
    tms = [transaction.TransactionManager() for _ in range(2)]
    root = dbs[0].open(tms[0]).root()
    for i in range(10):
        root['k%d' % i] = PersistentMapping(n=i)
    tms[0].commit()
    # The second client connects after that commit, so its first view
    # has the mappings: one connected before could open its connection
    # before the commit's invalidation reached it (KeyError 'k0', seen
    # once in CI).
    dbs.append(ZEO.DB(addr, wait_timeout=10, client_label='status-test'))
    roots = [root, dbs[1].open(tms[1]).root()]
    for i in range(n):
        roots[0]['k0']['n'] = i
        roots[1]['k0']['n'] = -i
        tms[0].commit()
        with pytest.raises(ConflictError):
            tms[1].commit()
        tms[1].abort()
    oid = roots[0]['k0']._p_oid
    return dbs, oid


def test_status_page(zodbd_bin, tmp_path):
    binary = chromium.find()
    if not binary and os.environ.get('CI'):
        pytest.fail('chromium not found, and `make chromium` could not install it: '
                    'in CI the status page must be tested', pytrace=False)
    if not binary:
        pytest.skip('chromium not found, and `make chromium` could not install it here '
                    '(it needs root and apt-get with Debian\'s archive): the status page is not tested')
    http = '127.0.0.1:%d' % free_port()
    srv = Server(zodbd_bin, str(tmp_path / 'Data.fs'), tmp_path, extra=['--create', '--http-addr', http]).start()
    dbs, load = [], []
    try:
        wait_ready(http)
        dbs, oid = make_conflicts(srv.addr, 3)
        url = 'zeo://127.0.0.1:%d' % srv.port
        load = [subprocess.Popen([zodbd_bin, 'wrk'] + args + ['-c', '1', '-d', '60s', url],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for args in ([], ['--commit', '--objects', '20'])]
        with chromium.Browser(binary, width=1280, height=1000) as b:
            page = b.open('http://%s/' % http)
            # Samples since the server started, and every plot drawn with
            # points: commits and loads are running.
            page.wait('+document.body.dataset.samples >= 3 && %s.every(id => '
                      '+document.getElementById(id).dataset.points > 0) && '
                      '+document.getElementById("t-commits").textContent > 0' % json.dumps(PLOTS))
            first = json.loads(page.eval(OBSERVE))
            time.sleep(2.5)
            second = json.loads(page.eval(OBSERVE))
            assert second['seq'] > first['seq'] and second['polls'] > first['polls'], (first, second)
            assert second['samples'] >= first['samples'] + 1, (first, second)
            for i, plot in enumerate(PLOTS):
                assert second['draws'][i] > first['draws'][i], (plot, first, second)
                assert second['points'][i] > 0, (plot, second)
            # Lines, not just the legend: p99 (red) on the latency plot,
            # commits (blue) on the transactions plot. A line grows with
            # the samples plotted, one a second: on a loaded machine it
            # may take a few more seconds to pass the legend's pixels.
            page.wait('(%s) > 60' % (PIXELS % (json.dumps('p-lat'), '[198, 40, 40]')))
            page.wait('(%s) > 60' % (PIXELS % (json.dumps('p-txn'), '[59, 111, 216]')))

            text = lambda id: page.eval('document.getElementById(%s).innerText' % json.dumps(id))
            assert page.eval('document.getElementById("ready").textContent') == 'ready'
            assert int(text('t-clients')) >= 2
            # The server's CPU: busy CPUs and µs per request under the load,
            # and the scheduler's setting in the header.
            assert float(text('t-cpu')) > 0, text('t-cpu')
            assert text('t-cpureq').endswith(' µs') and float(text('t-cpureq').split()[0].rstrip('k')) > 0, text('t-cpureq')
            assert re.fullmatch(r'GOMAXPROCS \d+ of \d+ CPUs', text('sched')), text('sched')
            clients = text('clients')
            assert 'status-test\t2' in clients, clients
            storages = page.eval('[...document.querySelectorAll("#storages tbody td")].map(td => td.textContent)')
            assert storages[0] == '1' and len(storages[4]) == 16 and int(storages[4], 16) > 0, storages
            assert 'persistent.mapping.PersistentMapping\t3' in text('cclasses'), text('cclasses')
            assert '0x%x\t3' % u64(oid) in text('coids'), text('coids')
            assert 'loadBefore' in text('methods') and 'tpc_finish' in text('methods'), text('methods')

            png = page.screenshot()
            assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10000
            (tmp_path / 'status-page.png').write_bytes(png)
            if os.environ.get('ZODBD_STATUS_SCREENSHOT'):
                with open(os.environ['ZODBD_STATUS_SCREENSHOT'], 'wb') as f:
                    f.write(png)
    finally:
        for p in load:
            p.terminate()
            p.wait(10)
        for db in dbs:
            db.close()
        assert srv.stop() == 0, srv.output()
