#!/usr/bin/env python3
"""Tests of install-go.py (make test runs them): against a fake Go module proxy on
loopback that serves a tiny fake Go release and its checksum database record."""

import http.server
import importlib.util
import io
import os
import stat
import subprocess
import sys
import tempfile
import threading
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "install-go.py")
spec = importlib.util.spec_from_file_location("install_go", SCRIPT)
install_go = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install_go)

ARCH = install_go.go_arch()
VERSION = "1.99.1"
MODVER = f"v0.0.1-go{VERSION}.linux-{ARCH}"
PREFIX = f"golang.org/toolchain@v0.0.1-go{VERSION}.linux-amd64/"

# The fake release: a "go" that prints its version, as `go env GOVERSION` does.
FILES = {
    PREFIX + "README.md": b"a fake Go release for install-go's tests\n",
    PREFIX + "bin/go": b"#!/bin/sh\necho go1.99.1\n",
    PREFIX + "pkg/tool/linux_amd64/compile": b"#!/bin/sh\nexit 0\n",
}
# FILES' module hash as Go computes it (golang.org/x/mod/sumdb/dirhash.Hash1, v0.43.0):
# the golden value that ties install-go's hash to Go's.
GOLDEN_H1 = "h1:TNLC3POxmpJ07LPkJDcNcpQ5SVUVXGfGAQdSrFMy1vM="


def archive(files):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


class FakeProxy:
    """Serves one toolchain archive and its checksum record at GOPROXY-style paths."""

    def __init__(self, zip_bytes, recorded_h1, sumdb_path="/sumdb/sum.golang.org"):
        routes = {
            f"/golang.org/toolchain/@v/{MODVER}.zip": zip_bytes,
            f"{sumdb_path}/lookup/golang.org/toolchain@{MODVER}":
                f"123\ngolang.org/toolchain {MODVER} {recorded_h1}\n".encode(),
        }

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = routes.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body or b"not found")

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def run(args, proxy):
    # --need 1.99.0: whatever Go this machine has is "too old", so the script installs.
    # GOSUMDB: the checksum database, when asked directly, is the fake proxy too.
    env = dict(os.environ, GOPROXY=f"{proxy.url},direct", GOSUMDB=f"sum.golang.org {proxy.url}/direct-sumdb")
    return subprocess.run([sys.executable, SCRIPT, "--need", "1.99.0", *args],
                          capture_output=True, text=True, env=env, timeout=60)


@unittest.skipIf(ARCH != "amd64", "the golden archive names linux-amd64")
class InstallGoTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dest = os.path.join(self.tmp.name, "go")

    def tearDown(self):
        self.tmp.cleanup()

    def install_from(self, files, recorded_h1, **proxy_options):
        """Runs install-go.py against a fake proxy serving files with that record."""
        proxy = FakeProxy(archive(files), recorded_h1, **proxy_options)
        try:
            return run(["--version", VERSION, "--dir", self.dest], proxy)
        finally:
            proxy.close()

    def test_module_hash_is_gos(self):
        self.assertEqual(install_go.module_hash(zipfile.ZipFile(io.BytesIO(archive(FILES)))), GOLDEN_H1)

    def test_installs_a_release_that_matches_the_checksum_database(self):
        r = self.install_from(FILES, GOLDEN_H1)
        self.assertEqual(r.returncode, 0, r.stderr)
        go = os.path.join(self.dest, "bin", "go")
        self.assertEqual(subprocess.run([go], capture_output=True, text=True).stdout.strip(), "go1.99.1")
        self.assertTrue(os.stat(os.path.join(self.dest, "pkg/tool/linux_amd64/compile")).st_mode & stat.S_IXUSR)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(self.dest, "README.md")).st_mode), 0o644)
        self.assertEqual(stat.S_IMODE(os.stat(self.dest).st_mode), 0o755)
        self.assertEqual(os.listdir(self.tmp.name), ["go"], "staging directory left behind")
        found = subprocess.run([sys.executable, SCRIPT, "--find", "--need", "1.99.0", "--dir", self.dest],
                               capture_output=True, text=True)
        self.assertEqual((found.returncode, found.stdout.strip()), (0, go))

    def test_asks_the_checksum_database_itself_when_the_proxy_does_not_pass_it_on(self):
        r = self.install_from(FILES, GOLDEN_H1, sumdb_path="/direct-sumdb")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"archive matches the checksum database ({GOLDEN_H1})", r.stdout)

    def test_installs_nothing_when_no_checksum_database_answers(self):
        r = self.install_from(FILES, GOLDEN_H1, sumdb_path="/nowhere")
        self.assertEqual(r.returncode, 1)
        self.assertIn("could not ask Go's checksum database", r.stderr)
        self.assertEqual(os.listdir(self.tmp.name), [])

    def test_refuses_an_archive_the_checksum_database_does_not_know(self):
        tampered = dict(FILES)
        tampered[PREFIX + "bin/go"] = b"#!/bin/sh\necho go1.99.1; rm -rf ~\n"
        r = self.install_from(tampered, GOLDEN_H1)
        self.assertEqual(r.returncode, 1)
        self.assertIn("does not match Go's checksum database", r.stderr)
        self.assertEqual(os.listdir(self.tmp.name), [], "something was unpacked")

    def test_leaves_an_existing_directory_alone(self):
        os.makedirs(os.path.join(self.dest, "bin"))
        r = self.install_from(FILES, GOLDEN_H1)
        self.assertEqual(r.returncode, 1)
        self.assertIn("exists but holds no Go >= 1.99.0", r.stderr)
        self.assertEqual(os.listdir(self.dest), ["bin"])

    def test_find_prints_nothing_when_no_go_will_do(self):
        r = subprocess.run([sys.executable, SCRIPT, "--find", "--need", "1.99.0", "--dir", self.dest],
                           capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stdout), (1, ""))


if __name__ == "__main__":
    unittest.main()
