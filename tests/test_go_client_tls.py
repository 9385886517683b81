"""The Go ZEO client (zeos://, via `zodbd hash`) over TLS, against runzeo
and `zodbd serve` configured with ZEO's own test certificates: the server
authenticates the client's certificate, the client checks the server's
chain (ZEO's test certificate has no subjectAltName, so not its name:
check_hostname=0, as ZEO's test client does)."""
import urllib.parse

import pytest

from zeoserver import Server, free_port, ssl_conf


def checksum(out):
    """The checksum field of `zodbd hash` output (crc32:... ;)."""
    return out.split(';')[0].strip()


@pytest.mark.parametrize('kind', ['runzeo', 'zodbd'])
def test_go_client_tls(kind, zodbd_bin, run_zodbd, tmp_copy, tmp_path):
    from ZEO.tests import testssl
    path = tmp_copy('1.fs')
    want = checksum(run_zodbd('hash', path).stdout)
    port = free_port()
    srv = Server(zodbd_bin, path, tmp_path, kind=kind,
                 conf=ssl_conf(port, path, testssl), port=port).start()
    try:
        def url(**params):
            return 'zeos://127.0.0.1:%d?%s' % (port, urllib.parse.urlencode(params))
        good = dict(ca=testssl.server_cert, cert=testssl.client_cert,
                    key=testssl.client_key, check_hostname='0')
        got = checksum(run_zodbd('hash', url(**good)).stdout)
        assert got == want

        # Refused: no client certificate; a CA the server's certificate
        # does not chain to; the name checked (the certificate has none).
        for bad in (dict(ca=testssl.server_cert, check_hostname='0'),
                    dict(good, ca=testssl.client_cert),
                    dict(good, check_hostname='1')):
            r = run_zodbd('hash', url(**bad), check=False)
            assert r.returncode != 0, bad
            assert 'zeo client' in r.stderr, r.stderr
    finally:
        srv.stop()
