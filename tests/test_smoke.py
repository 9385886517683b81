"""Smoke tests: the zodbd binary runs, the venv's ZODB/py works, and the
demo database that `make run` uses is deterministic and readable by both."""
import json
import os
import subprocess
import sys

import pytest
import transaction
import ZODB
from ZODB.FileStorage import FileStorage

COMMANDS = ['dump', 'tail', 'verify', 'zdump', 'reindex', 'info', 'catobj',
            'hash', 'serve', 'wrk', 'copy', 'pack', 'neo-storage']
# Only in the test build (go build -tags zodbdtest: bin/zodbd-test).
TEST_COMMANDS = ['debug-workload', 'debug-replay', 'debug-answers', 'neo-master']


@pytest.fixture(scope='module')
def help_text(zodbd_bin):
    p = subprocess.run([zodbd_bin, 'help'], capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == '', p.stderr
    return p.stdout


def listed(help_text):
    return [l.split()[0] for l in help_text.split('commands:', 1)[1].splitlines()
            if l.startswith('  ') and l.split()]


def test_help(help_text):
    assert 'commands:' in help_text
    listed = [l.split()[0] for l in help_text.split('commands:', 1)[1]
              .splitlines() if l.startswith('  ')]
    assert listed, help_text


@pytest.mark.parametrize('cmd', COMMANDS)
def test_help_lists(help_text, cmd):
    lines = help_text.split('commands:', 1)[1].splitlines()
    assert any(l.split()[:1] == [cmd] for l in lines), (
        '%s not in zodbd help:\n%s' % (cmd, help_text))


def test_test_tooling_only_in_test_build(help_text, zodbd_test_bin):
    assert not set(TEST_COMMANDS) & set(listed(help_text)), help_text
    p = subprocess.run([zodbd_test_bin, 'help'], capture_output=True, text=True, check=True)
    assert set(TEST_COMMANDS + COMMANDS) <= set(listed(p.stdout)), p.stdout


@pytest.mark.parametrize('cmd', COMMANDS)
def test_command_help_on_stdout(zodbd_bin, cmd):
    p = subprocess.run([zodbd_bin, cmd, '-h'], capture_output=True, text=True)
    assert (p.returncode, p.stderr) == (0, ''), p.stderr
    assert p.stdout.startswith('usage: zodbd %s' % cmd), p.stdout


def test_unknown_flag(zodbd_bin):
    p = subprocess.run([zodbd_bin, 'info', '--no-such-flag', 'x.fs'], capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ''
    assert p.stderr == ('zodbd info: flag provided but not defined: -no-such-flag\n'
                        'Run "zodbd info -h" for usage.\n'), p.stderr


def test_unknown_command(zodbd_bin):
    p = subprocess.run([zodbd_bin, 'no-such-command'], capture_output=True)
    assert p.returncode != 0


@pytest.mark.parametrize('name', ['1', '1packed'])
def test_dump_matches_fsdump(run_zodbd, fixtures_dir, name):
    """zodbd dump prints what ZODB/py's fsdump prints, byte for byte."""
    p = run_zodbd('dump', os.path.join(fixtures_dir, name + '.fs'), text=False)
    with open(os.path.join(fixtures_dir, name + '.fsdump.ok'), 'rb') as f:
        want = f.read()
    assert p.stdout == want


def test_zodbpy_opens_fixture(tmp_copy, fixtures_dir):
    """The venv's ZODB/py reads the fixture and agrees with expect.json."""
    with open(os.path.join(fixtures_dir, '1.expect.json')) as f:
        expect = json.load(f)
    stor = FileStorage(tmp_copy('1.fs'), read_only=True)
    try:
        assert len(stor) == expect['len']
        assert stor.lastTransaction().hex() == expect['lastTransaction']
        assert stor.getSize() == expect['getSize']
        assert len(list(stor.iterator())) == len(expect['txns'])
    finally:
        stor.close()


def make_demo(repo_root, path):
    subprocess.run([sys.executable,
                    os.path.join(repo_root, 'scripts', 'make_demo.py'),
                    str(path)], check=True, capture_output=True)


def test_demo(repo_root, tmp_path, run_zodbd):
    """scripts/make_demo.py is deterministic; ZODB/py and zodbd read it."""
    a, b = tmp_path / 'a' / 'Data.fs', tmp_path / 'b' / 'Data.fs'
    make_demo(repo_root, a)
    make_demo(repo_root, b)
    assert a.read_bytes() == b.read_bytes()
    assert sorted(os.listdir(tmp_path / 'a')) == ['Data.fs', 'Data.fs.index']

    db = ZODB.DB(FileStorage(str(a), read_only=True))
    try:
        head = db.storage.lastTransaction()
        conn = db.open()
        root = conn.root()
        assert sorted(root.keys()) == ['catalog', 'config', 'people']
        assert sorted(root['people']) == ['alice', 'bob', 'carol', 'dave',
                                          'erin']
        assert root['people']['alice']['age'] == 35
        assert len(root['catalog']) == 110
        assert root['config']['version'] == 2
        txns = list(db.storage.iterator())
        assert len(txns) == 6
        assert txns[-1].user == b'dave'
        conn.close()
        transaction.abort()
    finally:
        db.close()

    p = run_zodbd('info', a)
    assert head.hex() in p.stdout, p.stdout
