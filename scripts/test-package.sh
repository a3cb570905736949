#!/usr/bin/env bash
# Tests the Debian package (make test-package; needs root, installs and removes it):
# builds it, checks its fields, file list and modes, that the binary is static and
# reports the package's version, that systemd accepts its units, then installs it for
# real with dpkg, runs the installed binary, and removes and purges it.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "test-package: FAIL: $*" >&2; exit 1; }

if dpkg-query -W -f='${Status}' aggd 2>/dev/null | grep -q 'install ok installed'; then
	fail "aggd is already installed here (dpkg -s aggd); this test installs and removes the package, so it does not run on a machine that uses it"
fi

out=$(DIST=dist ./scripts/build-deb.sh)
echo "$out"
deb=$(echo "$out" | sed -n 's/^build-deb: \(dist\/.*\.deb\)$/\1/p')
[ -f "$deb" ] || fail "no package built"

field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = aggd ] || fail "Package is $(field Package)"
[ "$(field Architecture)" = "$(dpkg --print-architecture)" ] || fail "Architecture $(field Architecture) on a $(dpkg --print-architecture) machine"
version=$(field Version)
dpkg --compare-versions "$version" gt 0~git20260101000000 || fail "Version $version does not sort after 2026's start"
case $(field Depends) in *nftables*) ;; *) fail "Depends lacks nftables: $(field Depends)" ;; esac

contents=$(dpkg-deb -c "$deb")
for path in ./usr/bin/aggd ./lib/systemd/system/aggd-cpe.service ./lib/systemd/system/aggd-headend.service \
	./usr/share/doc/aggd/examples/cpe.example.yaml ./usr/share/doc/aggd/examples/headend.example.yaml \
	./usr/share/doc/aggd/copyright ./usr/share/doc/aggd/README.md ./usr/share/aggd/prometheus/aggd.rules.yml \
	./usr/share/aggd/grafana/aggd.json ./etc/aggd/; do
	grep -q " $path\$" <<<"$contents" || fail "$path is not in the package"
done
grep -q '^drwx------ root/root .* \./etc/aggd/$' <<<"$contents" || fail "/etc/aggd is not root-only (it will hold private keys)"
grep -q '^-rwxr-xr-x root/root .* \./usr/bin/aggd$' <<<"$contents" || fail "/usr/bin/aggd is not root-owned 0755"
if grep -q ' \./etc/aggd/.' <<<"$contents"; then
	fail "the package ships files under /etc/aggd; configs and keys are the user's"
fi

x=$(mktemp -d)
trap 'rm -rf "$x"' EXIT
dpkg-deb -x "$deb" "$x"
if readelf -d "$x/usr/bin/aggd" 2>/dev/null | grep -q NEEDED; then
	fail "the packaged binary is dynamically linked: $(readelf -d "$x/usr/bin/aggd" | grep NEEDED | tr -s ' ')"
fi
grep -q '^ExecStart=/usr/bin/aggd cpe ' "$x/lib/systemd/system/aggd-cpe.service" || fail "aggd-cpe.service does not start /usr/bin/aggd"

echo "test-package: installing $deb"
dpkg -i "$deb" >/dev/null
trap 'dpkg --purge aggd >/dev/null 2>&1 || true; rm -rf "$x"' EXIT
got=$(/usr/bin/aggd version)
case $got in *"$version"*) ;; *) fail "installed aggd says \"$got\", want version $version" ;; esac
for unit in aggd-cpe.service aggd-headend.service; do
	# verify loads the unit as systemd would: unknown keys, bad paths or a missing
	# binary are errors.
	systemd-analyze verify "/lib/systemd/system/$unit" || fail "systemd-analyze verify $unit"
done
for shipped in prometheus/aggd.rules.yml grafana/aggd.json; do
	cmp -s "deploy/$shipped" "/usr/share/aggd/$shipped" || fail "/usr/share/aggd/$shipped is not deploy/$shipped"
done
# The service's first step on a machine without a config: a clear error, not a crash.
if msg=$(/usr/bin/aggd check-config /etc/aggd/cpe.yaml 2>&1); then
	fail "check-config passed without a config"
fi
grep -qi "cpe.yaml" <<<"$msg" || fail "check-config without a config says: $msg"
echo "test-package: check-config without a config says: $msg"

dpkg -r aggd >/dev/null
[ ! -e /usr/bin/aggd ] || fail "/usr/bin/aggd left after dpkg -r"
[ ! -e /lib/systemd/system/aggd-cpe.service ] || fail "aggd-cpe.service left after dpkg -r"
# What the CPE counted for its data caps goes with a purge (the configs in /etc/aggd stay).
mkdir -p /var/lib/aggd && echo '{}' >/var/lib/aggd/data-usage.json
dpkg --purge aggd >/dev/null
[ ! -e /var/lib/aggd ] || fail "/var/lib/aggd left after dpkg --purge"
dpkg-query -W aggd >/dev/null 2>&1 && [ "$(dpkg-query -W -f='${Status}' aggd)" != "unknown ok not-installed" ] &&
	fail "aggd still known to dpkg after purge: $(dpkg-query -W -f='${Status}' aggd)"
echo "test-package: ok ($deb, version $version)"
