"""Shared pytest fixtures for zodbd's Python-side tests.

The tests run with the venv's python (`make pytest`, part of `make test`),
which has ZODB/py, the reference that zodbd must match.

- repo_root     the repository root
- zodbd_bin     the zodbd binary: $ZODBD, else <repo>/bin/zodbd (`make build`)
- zodbd_test_bin  the test build, with debug-*, neo-master and neo-storage
                --with-master: $ZODBD_TEST, else <repo>/bin/zodbd-test
- fixtures_dir  <repo>/fs1/testdata, the FileStorage conformance fixtures
- neo_testdata  <repo>/testdata/neo, NEO/py's captures and databases
- dataset       dataset('prod1-1024') returns data/datasets/NAME.fs, made
                by scripts/dataset.sh when missing (shared: copy to write)
- tmp_copy      tmp_copy('1.fs') copies a fixture into tmp_path, returns its path
- run_zodbd     run_zodbd('info', path) runs zodbd, returns CompletedProcess
- marshal       'Z' (pickle) or 'M' (msgpack): tests using it run with both
- serve         serve(path, extra=[...]) starts `zodbd serve` on path with
                that marshalling (tests/zeoserver.py), stopped at the end
"""
import os
import shutil
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='session')
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope='session')
def zodbd_bin():
    path = os.environ.get('ZODBD') or os.path.join(REPO_ROOT, 'bin', 'zodbd')
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail('zodbd binary not found at %s: run `make build` first '
                    '(or set ZODBD=/path/to/zodbd)' % path, pytrace=False)
    return os.path.abspath(path)


@pytest.fixture(scope='session')
def zodbd_test_bin():
    path = os.environ.get('ZODBD_TEST') or os.path.join(REPO_ROOT, 'bin', 'zodbd-test')
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail('zodbd test build not found at %s: run `make build` first '
                    '(or set ZODBD_TEST=/path/to/zodbd-test)' % path, pytrace=False)
    return os.path.abspath(path)


@pytest.fixture(scope='session')
def fixtures_dir():
    return os.path.join(REPO_ROOT, 'fs1', 'testdata')


@pytest.fixture(scope='session')
def neo_testdata():
    return os.path.join(REPO_ROOT, 'testdata', 'neo')


def make_dataset(name):
    """data/datasets/NAME.fs, made with scripts/dataset.sh (this python,
    the checksum of testdata/datasets/SHA256SUMS) when missing."""
    path = os.path.join(REPO_ROOT, 'data', 'datasets', name + '.fs')
    if not os.path.exists(path):
        p = subprocess.run([os.path.join(REPO_ROOT, 'scripts', 'dataset.sh'), name, path],
                           cwd=REPO_ROOT, env=dict(os.environ, PYTHON=sys.executable),
                           capture_output=True, text=True)
        if p.returncode != 0:
            pytest.fail('scripts/dataset.sh %s: exit %d\n%s%s'
                        % (name, p.returncode, p.stdout, p.stderr), pytrace=False)
    return path


@pytest.fixture(scope='session')
def dataset():
    return make_dataset


@pytest.fixture
def tmp_copy(tmp_path, fixtures_dir):
    """tmp_copy(name, index=False): copy fixtures_dir/name (e.g. '1.fs') into
    tmp_path, with its .index when index is true; return the copy's path.
    The copy is writable (the fixtures are read-only files)."""
    def copy(name, index=False):
        src = os.path.join(fixtures_dir, name)
        dst = os.path.join(str(tmp_path), os.path.basename(name))
        shutil.copyfile(src, dst)
        if index and os.path.exists(src + '.index'):
            shutil.copyfile(src + '.index', dst + '.index')
        return dst
    return copy


@pytest.fixture
def run_zodbd(zodbd_bin):
    """run_zodbd(*args, check=True, text=True): run zodbd; with check, fail
    the test with its output when the exit status is not 0."""
    def run(*args, check=True, text=True):
        p = subprocess.run([zodbd_bin, *map(str, args)],
                           capture_output=True, text=text)
        if check and p.returncode != 0:
            pytest.fail('zodbd %s: exit %d\nstdout: %s\nstderr: %s'
                        % (' '.join(map(str, args)), p.returncode,
                           p.stdout, p.stderr), pytrace=False)
        return p
    return run


@pytest.fixture(params=['Z', 'M'], ids=['pickle', 'msgpack'])
def marshal(request):
    return request.param


@pytest.fixture
def serve(zodbd_bin, tmp_path, marshal):
    from zeoserver import Server
    servers = []

    def start(path, **kw):
        s = Server(zodbd_bin, path, tmp_path, msgpack=(marshal == 'M'), **kw).start()
        servers.append(s)
        return s
    yield start
    for s in servers:
        s.stop()


# The files that take longest run first: with `make test`'s two workers
# (pytest-xdist, --dist loadfile: a file's tests on one worker), a long
# file started last would make the other worker wait for it.
FIRST = ('test_zeo_zodb_mixins.py', 'test_zeo_contention_oracle.py', 'test_zeo_coherence.py')


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = os.path.basename(str(item.fspath))
        return FIRST.index(name) if name in FIRST else len(FIRST)
    items.sort(key=rank)  # stable: each file's own order is kept


# A test that takes more than SLOW seconds is named when it ends, as the
# run goes (the --durations table comes only at the end of a run that
# ends): on a CI machine slower than this one, the output then says where
# the time went even when the run is cut.
SLOW = 60


class SlowReporter:
    """Registered in the process that reports (not in xdist's workers)."""

    def __init__(self, config):
        self.config = config

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report):
        if report.when != 'call' or report.duration <= SLOW:
            return
        tr = self.config.pluginmanager.get_plugin('terminalreporter')
        if tr is not None:
            tr.write_line('slow: %s took %.0f s' % (report.nodeid, report.duration))


def pytest_configure(config):
    if not hasattr(config, 'workerinput'):
        config.pluginmanager.register(SlowReporter(config), 'zodbd-slow-reporter')


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    import zeoserver
    zeoserver.STARTED_LOGS.clear()  # before the test's fixtures start any


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report ends with the last lines of the logs of the
    servers (tests/zeoserver.py's Server) it started."""
    import zeoserver
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ('call', 'teardown'):
        for path in zeoserver.STARTED_LOGS:
            report.sections.append(('server log %s (end)' % path, zeoserver.read(path)[-3000:]))
