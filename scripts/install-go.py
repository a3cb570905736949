#!/usr/bin/env python3
"""install-go.py — make sure a Go toolchain new enough for aggd is installed.

If `go` on PATH, or the one in --dir, is at least --need (default: the release go.mod
asks for), nothing happens. Otherwise the official Go release --version is installed
into --dir (normally /usr/local/go, where go.dev's instructions put it). With --find it
only prints the path of the first go that is new enough (the Makefile's choice of go),
or nothing, and exits 1, if none is.

Where it comes from: the Go module proxy, which serves every Go release as the module
golang.org/toolchain (this is how `go` itself fetches a newer toolchain when a go.mod
asks for one). The archive is checked against Go's checksum database (sum.golang.org,
asked through the proxy) before anything is unpacked: its module hash (h1:, a SHA-256
over the SHA-256 of every file) must be the one the database has recorded for that
release. The proxy is $GOPROXY's first URL if it has one, else proxy.golang.org; a
proxy that does not pass the database's lookups on leaves them to sum.golang.org itself.

Standard library only: it runs on a machine that has nothing but Debian's python3.
"""

import argparse
import base64
import hashlib
import io
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile

DEFAULT_PROXY = "https://proxy.golang.org"
SUMDB = "sum.golang.org"
BY_HAND = "install Go by hand (https://go.dev/doc/install)"


def say(msg):
    print(f"install-go: {msg}", flush=True)


def die(msg):
    print(f"install-go: ERROR: {msg}", file=sys.stderr)
    sys.exit(1)


def go_mod_version():
    """The release in go.mod's `go` line, e.g. "1.26.0"."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "go.mod")
    with open(path) as f:
        for line in f:
            m = re.match(r"go (\d[\d.]*)\s*$", line)
            if m:
                return m.group(1)
    die(f"{path} has no `go` line")


def version_tuple(v):
    """(1, 26, 8) of "1.26.8", "go1.26.8" or "go1.26rc1" (a pre-release counts as .0)."""
    m = re.match(r"(?:go)?(\d+)(?:\.(\d+))?(?:\.(\d+))?", v)
    if not m:
        return None
    return tuple(int(x or 0) for x in m.groups())


def installed_version(go):
    """The version of the go binary at path go ("1.26.8"), or None if it does not run."""
    try:
        out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, GOTOOLCHAIN="local")).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def go_arch():
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    if not arch:
        die(f"no Go release is fetched for this machine's architecture ({platform.machine()}); {BY_HAND}")
    return arch


def proxy_url():
    for entry in re.split(r"[,|]", os.environ.get("GOPROXY", "")):
        if entry.startswith("https://") or entry.startswith("http://"):
            return entry.rstrip("/")
    return DEFAULT_PROXY


def sumdb_url():
    """Where Go's checksum database answers directly: GOSUMDB's URL if it names one for
    sum.golang.org ("sum.golang.org[+key] URL", as go reads it), else https://sum.golang.org."""
    parts = os.environ.get("GOSUMDB", "").split()
    if len(parts) == 2 and parts[0].split("+")[0] == SUMDB:
        return parts[1].rstrip("/")
    return f"https://{SUMDB}"


def try_fetch(url):
    """(body, None), or (None, the error) if url cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            return r.read(), None
    except (urllib.error.URLError, OSError) as e:
        return None, e


def fetch(url, what):
    body, err = try_fetch(url)
    if err is not None:
        die(f"could not download {what} from {url}: {err}. Check the network (and GOPROXY), or {BY_HAND}")
    return body


def recorded_hash(proxy, module, version):
    """The h1: hash the checksum database has for module@version's archive: asked through
    the proxy (proxying the database is optional in the GOPROXY protocol), else directly."""
    urls = [f"{proxy}/sumdb/{SUMDB}/lookup/{module}@{version}", f"{sumdb_url()}/lookup/{module}@{version}"]
    errors = []
    for url in urls:
        body, err = try_fetch(url)
        if err is not None:
            errors.append(f"{url}: {err}")
            continue
        for line in body.decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == module and parts[1] == version and parts[2].startswith("h1:"):
                return parts[2]
        die(f"the checksum database has no hash for {module}@{version} ({url}); is Go {version} a real release?")
    die("could not ask Go's checksum database for the release's hash, so nothing was installed: "
        + "; ".join(errors) + f". Check the network (and GOPROXY), or {BY_HAND}")


def module_hash(archive):
    """Go's h1: hash of a module archive (golang.org/x/mod/sumdb/dirhash.Hash1): SHA-256 over
    the lines "<sha256 of the file>  <name>\\n" of every file, sorted by name."""
    summary = hashlib.sha256()
    for name in sorted(archive.namelist()):
        if "\n" in name:
            die(f"archive entry {name!r} has a newline in its name")
        summary.update(f"{hashlib.sha256(archive.read(name)).hexdigest()}  {name}\n".encode())
    return "h1:" + base64.b64encode(summary.digest()).decode()


def unpack(archive, prefix, dest):
    """Writes the archive's files below prefix into dest. Module archives record no file
    modes, so the programs (bin/, pkg/tool/) are made executable, as `go` does for them."""
    for name in archive.namelist():
        if not name.startswith(prefix):
            die(f"archive entry {name!r} is outside {prefix}")
        rel = name[len(prefix):]
        if not rel or rel.startswith("/") or ".." in rel.split("/"):
            die(f"archive entry {name!r} has an unsafe path")
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(archive.read(name))
        executable = rel.startswith("bin/") or rel.startswith("pkg/tool/")
        os.chmod(path, 0o755 if executable else 0o644)


def install(version, target):
    module = "golang.org/toolchain"
    mversion = f"v0.0.1-go{version}.linux-{go_arch()}"
    proxy = proxy_url()
    want = recorded_hash(proxy, module, mversion)
    say(f"downloading Go {version} ({module}@{mversion}) from {proxy} (about 70 MB)")
    data = fetch(f"{proxy}/{module}/@v/{mversion}.zip", f"Go {version}")
    archive = zipfile.ZipFile(io.BytesIO(data))
    got = module_hash(archive)
    if got != want:
        die(f"Go {version}'s archive from {proxy} does not match Go's checksum database "
            f"({got}, recorded {want}): not installed")
    say(f"archive matches the checksum database ({want})")
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".go-install-", dir=parent)
    try:
        unpack(archive, f"{module}@{mversion}/", staging)
        got_version = installed_version(os.path.join(staging, "bin", "go"))
        if got_version != f"go{version}":
            die(f"the unpacked Go reports {got_version!r}, not go{version}")
        os.chmod(staging, 0o755)  # mkdtemp made it private
        os.rename(staging, target)  # target does not exist (checked by the caller)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say(f"installed Go {version} in {target}; add {target}/bin to PATH to use it outside make")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--need", help="the oldest Go release that will do (default: go.mod's, e.g. 1.26.0)")
    ap.add_argument("--version", help="the Go release to install if none will do, e.g. 1.26.8")
    ap.add_argument("--dir", default="/usr/local/go", help="where to install it (default /usr/local/go)")
    ap.add_argument("--find", action="store_true", help="print the first go that will do; install nothing")
    args = ap.parse_args()
    args.need = args.need or go_mod_version()
    need = version_tuple(args.need)
    if need is None:
        die(f"--need {args.need!r}: want a version like 1.26.0")

    candidates = [shutil.which("go"), os.path.join(args.dir, "bin", "go")]
    for go in dict.fromkeys(c for c in candidates if c and os.path.exists(c)):
        have = installed_version(go)
        if have and version_tuple(have) >= need:
            if args.find:
                print(os.path.abspath(go))
            else:
                say(f"{go} is {have}: new enough (>= go{args.need})")
            return
        if not args.find:
            say(f"{go} is {have or 'not runnable'}: older than go{args.need}")
    if args.find:
        sys.exit(1)

    if not args.version or version_tuple(args.version) is None:
        die(f"--version {args.version!r}: want the release to install, e.g. 1.26.8")
    if version_tuple(args.version) < need:
        die(f"--version {args.version} is older than --need {args.need}")

    if os.path.lexists(args.dir):
        die(f"{args.dir} exists but holds no Go >= {args.need}. Remove it (rm -rf {args.dir}) to let "
            f"this script install Go {args.version} there, or install Go >= {args.need} yourself "
            "(https://go.dev/doc/install) and put it first on PATH")
    install(args.version, args.dir)


if __name__ == "__main__":
    main()
