#!/usr/bin/env bash
# Builds the Debian package (make deb): dist/aggd_<version>_<arch>.deb, for the Go
# toolchain's target architecture (GOARCH=arm64 make deb cross-builds one).
#
# The binary is linked statically (CGO_ENABLED=0), so the package depends on no C
# library version; the BPF programs are compiled into it. The units are those in
# deploy/systemd with the binary at /usr/bin/aggd. Nothing under /etc is shipped: the
# configs and keys are the user's (the examples go to /usr/share/doc/aggd/examples).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${DIST:-dist}
goarch=$(go env GOARCH)
case $goarch in
amd64 | arm64 | armhf | i386 | riscv64 | ppc64el | s390x) arch=$goarch ;;
arm) arch=armhf ;;
386) arch=i386 ;;
ppc64le) arch=ppc64el ;;
*) echo "build-deb: no Debian architecture for GOARCH=$goarch" >&2; exit 1 ;;
esac

# A Debian version that sorts by commit time: 0~git<UTC time>.<commit>[.dirty].
commit=$(git rev-parse --short HEAD)
when=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S)
version="0~git${when}.${commit}"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
	version="${version}.dirty"
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -d -m 0755 "$stage/DEBIAN" "$stage/usr/bin" "$stage/lib/systemd/system" \
	"$stage/usr/share/doc/aggd/examples" "$stage/usr/share/doc/aggd/docs" "$stage/usr/share/aggd/prometheus" \
	"$stage/usr/share/aggd/grafana"
install -d -m 0700 "$stage/etc/aggd"

echo "build-deb: building aggd $version for $arch (static)"
CGO_ENABLED=0 go build -trimpath \
	-ldflags "-X github.com/aggd/aggd/internal/buildinfo.Version=$version" \
	-o "$stage/usr/bin/aggd" ./cmd/aggd
chmod 0755 "$stage/usr/bin/aggd"

for unit in deploy/systemd/*.service; do
	sed 's#/usr/local/bin/aggd#/usr/bin/aggd#g' "$unit" >"$stage/lib/systemd/system/$(basename "$unit")"
	chmod 0644 "$stage/lib/systemd/system/$(basename "$unit")"
done
install -m 0644 README.md BENCHMARKS.md "$stage/usr/share/doc/aggd/"
install -m 0644 configs/*.example.yaml "$stage/usr/share/doc/aggd/examples/"
install -m 0644 docs/*.md "$stage/usr/share/doc/aggd/docs/"
install -m 0644 deploy/debian/copyright "$stage/usr/share/doc/aggd/copyright"
# Not under /usr/share/doc: Prometheus's and Grafana's configs point at them, and minimal
# images drop docs.
install -m 0644 deploy/prometheus/aggd.rules.yml "$stage/usr/share/aggd/prometheus/"
install -m 0644 deploy/grafana/aggd.json "$stage/usr/share/aggd/grafana/"
for script in postinst prerm postrm; do
	install -m 0755 "deploy/debian/$script" "$stage/DEBIAN/$script"
done
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" \
	deploy/debian/control.in >"$stage/DEBIAN/control"

mkdir -p "$out"
deb="$out/aggd_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "build-deb: $deb"
