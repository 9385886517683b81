"""Claims of README.md and docs/*.md checked against what zodbd does.

Each test is a mismatch that an audit found by reading the documentation
as a newcomer would and running what it says (each failed before its
doc or help text was mended); they are minimized: a fixture of
fs1/testdata and one command.
"""
import glob
import os
import re
import subprocess
import sys
import textwrap

from zeoserver import free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMMANDS = ['analyze', 'backup', 'catobj', 'copy', 'dump', 'hash', 'info',
            'neo-storage', 'pack', 'referrers', 'refs', 'reindex', 'restore',
            'serve', 'tail', 'verify', 'wrk', 'zdump']


def read_doc(name):
    with open(os.path.join(REPO_ROOT, name), encoding='utf-8') as f:
        return f.read()


def all_docs():
    return ''.join(read_doc(os.path.relpath(p, REPO_ROOT)) for p in
                   [os.path.join(REPO_ROOT, 'README.md')] +
                   sorted(glob.glob(os.path.join(REPO_ROOT, 'docs', '*.md'))))


def help_flags(run_zodbd, cmd):
    out = run_zodbd(cmd, '-h').stdout
    return re.findall(r'^  -([a-z][a-z0-9-]*)', out, re.M)


def test_every_help_option_is_documented(run_zodbd):
    """Every option `zodbd CMD -h` lists is named somewhere in README.md or
    docs/*.md (`zodbd wrk --inflight` was not)."""
    docs = all_docs()
    missing = []
    for cmd in COMMANDS:
        for name in help_flags(run_zodbd, cmd):
            if not re.search(r'(^|[^A-Za-z0-9-])--?%s([^A-Za-z0-9-]|$)' % re.escape(name),
                             docs, re.M):
                missing.append('zodbd %s -%s' % (cmd, name))
    assert missing == []


def test_neo_storage_help_names_with_master_argument_addr(run_zodbd):
    """docs/tools.md and docs/neo.md: `neo-storage --with-master ADDR`.
    `zodbd neo-storage -h` showed `-with-master zodbd-test neo-master`:
    Go's flag package takes the first back-quoted word of the usage text
    as the argument's name, and the text quoted the test command first."""
    out = run_zodbd('neo-storage', '-h').stdout
    line = [l for l in out.splitlines() if l.startswith('  -with-master')]
    assert line == ['  -with-master ADDR']


def make_blob_db(path, blob_dir):
    """Data.fs with a blob written twice (the first revision's file is
    what a pack removes), made with ZODB/py."""
    script = textwrap.dedent('''
        import sys, transaction, ZODB, ZODB.FileStorage
        from ZODB.blob import Blob
        db = ZODB.DB(ZODB.FileStorage.FileStorage(sys.argv[1], blob_dir=sys.argv[2]))
        r = db.open().root()
        r['b'] = Blob(b'one')
        transaction.commit()
        with r['b'].open('w') as f:
            f.write(b'two')
        transaction.commit()
        db.close()
    ''')
    subprocess.run([sys.executable, '-c', script, path, blob_dir], check=True)


def test_pack_help_agrees_that_blob_dir_old_is_kept(run_zodbd, tmp_path):
    """docs/tools.md ("--blob-dir DIR": "the directory as it was is kept
    beside FILE.old, as DIR.old"), docs/zeo-server.md and pack's own
    -blob-dir line say DIR.old is kept, and it is; the text of
    `zodbd pack -h` said the removed blob files "are not kept beside
    FILE.old"."""
    fs = str(tmp_path / 'Data.fs')
    blobs = str(tmp_path / 'blobs')
    make_blob_db(fs, blobs)
    run_zodbd('pack', '-q', '--blob-dir', blobs, fs)
    old = [os.path.join(d, f) for d, _, fs_ in os.walk(blobs + '.old')
           for f in fs_ if f.endswith('.blob')]
    assert len(old) == 2          # DIR.old holds the directory as it was
    help_text = ' '.join(run_zodbd('pack', '-h').stdout.split())
    assert 'they are not kept beside FILE.old' not in help_text
    assert 'the directory as it was kept as DIR.old beside FILE.old' in help_text


def test_client_md_url_table_lists_every_scheme(run_zodbd):
    """docs/client.md, "Opening a storage by URL": its table lists file
    paths, zeo:// and zeos:// and said "The NEO client will register
    neo:// the same way", long after it did; sqlite:PATH, which `zodbd
    hash -h` and README name, was in no URL table of client.md."""
    doc = read_doc('docs/client.md')
    section = doc.split('## Opening a storage by URL', 1)[1].split('\n## ', 1)[0]
    assert 'will register `neo://`' not in section
    assert '`neo://' in section and '`sqlite:PATH`' in section
    hash_help = run_zodbd('hash', '-h').stdout
    assert 'sqlite:PATH' in hash_help


def test_backup_verify_message_as_documented(run_zodbd, tmp_copy, tmp_path):
    """docs/operations.md, "Verifying", shows the report of a damaged
    backup file. It showed a line without the md5 part, which a damaged
    byte always adds ("has checksum X instead of Y; first damage: ...",
    backup/verify.go): the documented line never appeared."""
    fs = tmp_copy('1.fs')
    repo = tmp_path / 'repo'
    repo.mkdir()
    run_zodbd('backup', '-q', '-r', repo, fs)
    [full] = glob.glob(str(repo / '*.fs'))
    with open(full, 'r+b') as f:        # the last redundant length's low byte
        f.seek(-1, 2)
        f.write(b'\0')
    p = run_zodbd('backup', '-r', repo, '--verify', check=False)
    assert p.returncode == 1
    form = (r'zodbd backup: verify: \S+: offset \d+ \(Data\.fs offset \d+\): '
            r'has checksum \S+ instead of \S+; first damage: '
            r'redundant transaction length \d+, want \d+ \(transaction at \d+\)')
    assert re.fullmatch(form + r'\n', p.stderr), p.stderr
    documented = re.search(r'^zodbd backup: verify: REPO/.*$', read_doc('docs/operations.md'), re.M).group(0)
    assert re.fullmatch(form.replace(r'has checksum \S+ instead of \S+', 'has checksum 97ac… instead of bad5…'),
                        documented), documented


def test_pack_time_before_1970_refused_as_documented(run_zodbd, tmp_copy):
    """docs/tools.md ("zodbd pack") said only a time that no tid encodes
    (before 1900, infinite, NaN) is refused; zodbd refuses every time <= 0
    as a usage error (ZODB/py packs at -1000, 1969-12-31: nothing), which
    the doc now says."""
    fs = tmp_copy('1.fs')
    p = run_zodbd('pack', '--dry-run', '-q', '--time', '-1000', fs, check=False)
    assert p.returncode == 2 and 'positive' in p.stderr, p.stderr
    assert '`--time` must be positive' in read_doc('docs/tools.md')


def test_neo_node_metrics_as_documented(zodbd_bin, zodbd_test_bin, tmp_copy):
    """docs/neo.md, "--http-addr": for a FileStorage backend the node
    exports the storage's objects, size, index and pack metrics, and said
    "Writes (and with them commits, conflicts, commit lock and fsync
    figures) are not served by the node yet". A --read-write node that
    took commits exports zodbd_commit_lock_{wait,hold}_seconds and
    zodbd_fsync_{duration_seconds,group_transactions} too: every metric
    it exports is in that section."""
    import time
    import urllib.request
    fs = tmp_copy('1.fs')
    master, http = free_port(), free_port()
    node = subprocess.Popen([zodbd_test_bin, 'neo-storage', '--cluster', 'docs',
                             '--with-master', '127.0.0.1:%d' % master, '--read-write',
                             '--http-addr', '127.0.0.1:%d' % http, fs],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = 'http://127.0.0.1:%d' % http
        for _ in range(100):
            try:
                if urllib.request.urlopen(url + '/ready', timeout=1).status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        subprocess.run([zodbd_bin, 'wrk', '--commit', '-c', '1', '-d', '0.3s',
                        'neo://docs@127.0.0.1:%d' % master],
                       check=True, capture_output=True, timeout=60)
        text = urllib.request.urlopen(url + '/metrics', timeout=5).read().decode()
    finally:
        node.terminate()
        node.wait(timeout=30)
    names = set(re.sub(r'_(bucket|sum|count)$', '', m)
                for m in re.findall(r'^(zodbd_[a-z_]+)', text, re.M))
    section = read_doc('docs/neo.md').split('- `--http-addr HOST:PORT`', 1)[1].split('\n- `', 1)[0]
    undocumented = sorted(n for n in names if '`%s`' % n not in section)
    assert undocumented == []
