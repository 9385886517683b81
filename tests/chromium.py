"""Headless Chromium driven over the DevTools protocol, for browser tests.

Debian's chromium (/usr/bin/chromium; `make chromium` installs it) is
started with --remote-debugging-pipe: the protocol's JSON messages, each
ended by a NUL byte, go to the browser on its file descriptor 3 and come
back on 4. No websocket, no driver, nothing beyond the standard library.

    with Browser() as b:
        page = b.open('http://127.0.0.1:8080/')
        page.eval('document.title')
        png = page.screenshot()
"""
import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

# What this machine's network and sandboxing need (docs/operations.md,
# "Status page"): no sandbox (root in a container), no GPU, and no
# background connections to Google's services, which the closed network
# refuses.
FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
         '--disable-background-networking', '--disable-component-update',
         '--disable-sync', '--no-first-run', '--no-default-browser-check',
         '--disable-extensions', '--hide-scrollbars', '--mute-audio']


def find():
    """The chromium binary: $CHROMIUM, else chromium on PATH, else None."""
    path = os.environ.get('CHROMIUM')
    if path:
        return path if os.access(path, os.X_OK) else None
    return shutil.which('chromium') or shutil.which('chromium-browser')


def _above(fd, low):
    """fd moved to a descriptor >= low (the old one closed)."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD, low)
    os.close(fd)
    return new


class Error(Exception):
    pass


class Browser:
    """A headless Chromium process with a fresh profile, stopped by close."""

    def __init__(self, binary=None, width=1280, height=1000, timeout=30):
        self.binary = binary or find()
        if not self.binary:
            raise Error('chromium not found')
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix='zodbd-chromium-')
        to_r, self._to_w = os.pipe()      # our commands: browser's fd 3
        self._from_r, from_w = os.pipe()  # its answers: browser's fd 4
        # The browser's ends above 4, so that moving them to 3 and 4
        # cannot overwrite one with the other.
        to_r, from_w = [_above(fd, 10) for fd in (to_r, from_w)]
        args = FLAGS + ['--user-data-dir=' + self.profile, '--window-size=%d,%d' % (width, height),
                        '--remote-debugging-pipe', 'about:blank']
        # bash (dash takes no descriptor above 9) puts the pipe ends on 3
        # and 4, then becomes chromium.
        script = 'exec 3<&%d 4>&%d %d<&- %d>&-; exec "$0" "$@"' % (to_r, from_w, to_r, from_w)
        self.log = open(os.path.join(self.profile, 'chromium.log'), 'wb')
        self.proc = subprocess.Popen(['bash', '-c', script, self.binary] + args, pass_fds=(to_r, from_w),
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        os.close(to_r)
        os.close(from_w)
        self._next = 0
        self._lock = threading.Lock()
        self._answers = {}
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        buf = b''
        while True:
            try:
                chunk = os.read(self._from_r, 1 << 16)
            except OSError:
                chunk = b''
            if not chunk:
                with self._cond:
                    self._closed = True
                    self._cond.notify_all()
                return
            buf += chunk
            while b'\0' in buf:
                msg, buf = buf.split(b'\0', 1)
                m = json.loads(msg)
                if 'id' in m:
                    with self._cond:
                        self._answers[m['id']] = m
                        self._cond.notify_all()

    def call(self, method, session=None, **params):
        """Sends a command and returns its result; an error answer raises
        Error."""
        with self._lock:
            self._next += 1
            mid = self._next
        msg = {'id': mid, 'method': method, 'params': params}
        if session:
            msg['sessionId'] = session
        os.write(self._to_w, json.dumps(msg).encode() + b'\0')
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while mid not in self._answers:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise Error('%s: no answer (%s); chromium log:\n%s' % (
                        method, 'browser gone' if self._closed else 'timeout', self.output()))
                self._cond.wait(left)
            m = self._answers.pop(mid)
        if 'error' in m:
            raise Error('%s: %s' % (method, m['error']))
        return m.get('result', {})

    def open(self, url):
        """Opens url in a new tab and returns its Page once loaded."""
        tid = self.call('Target.createTarget', url='about:blank')['targetId']
        sid = self.call('Target.attachToTarget', targetId=tid, flatten=True)['sessionId']
        page = Page(self, sid)
        page.call('Page.enable')
        page.call('Runtime.enable')
        page.call('Page.navigate', url=url)
        page.wait('document.readyState === "complete"')
        return page

    def output(self):
        self.log.flush()
        try:
            with open(os.path.join(self.profile, 'chromium.log'), 'rb') as f:
                return f.read().decode(errors='replace')[-4000:]
        except OSError:
            return ''

    def close(self):
        try:
            os.close(self._to_w)  # the browser exits when its pipe closes
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._from_r)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Page:
    """A tab of a Browser."""

    def __init__(self, browser, session):
        self.browser = browser
        self.session = session

    def call(self, method, **params):
        return self.browser.call(method, session=self.session, **params)

    def eval(self, expr):
        """The value of a JavaScript expression (JSON-able)."""
        r = self.call('Runtime.evaluate', expression=expr, returnByValue=True, awaitPromise=True)
        if 'exceptionDetails' in r:
            raise Error('%s: %s' % (expr, r['exceptionDetails']))
        return r['result'].get('value')

    def wait(self, expr, timeout=20):
        """Waits until expr is true (polled every 100 ms) and returns its
        value; raises Error after timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.eval(expr)
            if v:
                return v
            if time.monotonic() > deadline:
                raise Error('still false after %ss: %s' % (timeout, expr))
            time.sleep(0.1)

    def screenshot(self):
        """A PNG of the whole page."""
        r = self.call('Page.captureScreenshot', format='png', captureBeyondViewport=True)
        return base64.b64decode(r['data'])
