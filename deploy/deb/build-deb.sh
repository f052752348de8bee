#!/usr/bin/env bash
# build-deb.sh: build the Debian package tandem_VERSION_amd64.deb from this tree.
#
#   deploy/deb/build-deb.sh [OUT_DIR]      (default OUT_DIR: deploy/deb/out)
#
# A release build with prefix /usr (OUT_DIR/build), `meson install --strip --destdir`, then the
# Debian layout: binaries in /usr/bin; the systemd units in /lib/systemd/system with their
# ExecStart= and Documentation= paths moved from /usr/local to /usr; the example configs in
# /etc/tandem as conffiles; the docs, copyright and changelog in /usr/share/doc/tandem; Depends
# computed by dpkg-shlibdeps from the binaries (Debian package dpkg-dev). lintian then checks the
# result when it is installed (deploy/README.md explains the findings left). Needs the build
# dependencies of the tree (scripts/install-deps) and dpkg-dev; runs as any user.
# TANDEM_DEB_MAINTAINER ("Name <mail>") sets the Maintainer field and the changelog's signature;
# TANDEM_DEB_LINTIAN=0 skips lintian (tests/deploy/systemd_test.sh, which only installs the package).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${1:-$src/deploy/deb/out}" && cd "${1:-$src/deploy/deb/out}" && pwd)
build=$out/build
root=$out/root
version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$src/meson.build" | head -1)
arch=$(dpkg --print-architecture)
maintainer=${TANDEM_DEB_MAINTAINER:-tandem developers <tandem@localhost.localdomain>}
deb=$out/tandem_${version}_${arch}.deb

echo "== release build in $build"
if [ ! -f "$build/build.ninja" ]; then
  # Debian's hardening flags (fortify, stack protector, relro, bind now), as a package build has
  CFLAGS="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)" \
    LDFLAGS="$(dpkg-buildflags --get LDFLAGS) -Wl,-z,now" \
    meson setup "$build" "$src" --buildtype=release --prefix=/usr >"$out/setup.log" 2>&1 ||
    { cat "$out/setup.log"; exit 1; }
fi
# only what is installed (the default target also builds the tests)
ninja -C "$build" router/tandem-router prefill/tandem-prefill decode/tandem-decode tools/tandem \
  >/dev/null
rm -rf "$root"
meson install -C "$build" --no-rebuild --destdir "$root" >/dev/null
strip --remove-section=.comment --remove-section=.note --strip-unneeded "$root"/usr/bin/*

echo "== Debian layout in $root"
doc=$root/usr/share/doc/tandem
# systemd units: from the documentation copy meson installed into their place, paths for /usr
install -d -m 0755 "$root/lib/systemd/system" "$root/etc/tandem" "$root/DEBIAN"
for u in tandem-router.service tandem-prefill@.service tandem-decode@.service tandem.target; do
  sed -e 's#/usr/local/bin/#/usr/bin/#g' -e 's#/usr/local/share/doc/#/usr/share/doc/#g' \
    "$src/deploy/$u" >"$root/lib/systemd/system/$u"
  chmod 0644 "$root/lib/systemd/system/$u"
  rm -f "$doc/deploy/$u"
done
for c in router.ini prefill.ini decode.ini; do
  install -m 0644 "$src/deploy/$c" "$root/etc/tandem/$c"
  rm -f "$doc/deploy/$c"
done
# the README's paths are those of a meson install to /usr/local; say where the package put them
sed -e 's#/usr/local/bin#/usr/bin#g' -e 's#/usr/local/share/doc#/usr/share/doc#g' \
  "$src/deploy/README.md" >"$doc/deploy/README.md"
install -m 0644 "$src/README.md" "$doc/README.md"
install -d -m 0755 "$doc/docs"
install -m 0644 "$src"/docs/*.md "$doc/docs/"
install -m 0644 "$src/deploy/deb/copyright" "$doc/copyright"
sed "s/@MAINTAINER@/$maintainer/" "$src/deploy/deb/changelog" | gzip -9n >"$doc/changelog.gz"
chmod 0644 "$doc/changelog.gz"
# manual pages: each program's --help, verbatim (the options are generated from its option table)
man=$root/usr/share/man/man1
install -d -m 0755 "$man"
declare -A what=([tandem]="the tandem command-line tool"
  [tandem-router]="the router of a tandem cluster"
  [tandem-prefill]="a prefill worker of a tandem cluster"
  [tandem-decode]="a decode worker of a tandem cluster")
for b in tandem tandem-router tandem-prefill tandem-decode; do
  {
    printf '.TH %s 1 "" "tandem %s" "tandem"\n.SH NAME\n%s \\- %s\n' \
      "${b^^}" "$version" "$b" "${what[$b]}"
    printf '.SH DESCRIPTION\n.nf\n'
    "$root/usr/bin/$b" --help 2>&1 | sed -e 's/\\/\\e/g' -e "s/^[.']/\\\\\&&/"
    printf '.fi\n.SH SEE ALSO\n/usr/share/doc/tandem/README.md,\n'
    printf '/usr/share/doc/tandem/deploy/README.md, /usr/share/doc/tandem/docs/configuration.md\n'
  } | gzip -9n >"$man/$b.1.gz"
  chmod 0644 "$man/$b.1.gz"
done
find "$root" -type d -exec chmod 0755 {} +

# Depends from the shared libraries the binaries link (dpkg-shlibdeps wants a debian/control)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/debian"
printf 'Source: tandem\n\nPackage: tandem\nArchitecture: any\n' >"$tmp/debian/control"
bins=("$root"/usr/bin/*)
depends=$(cd "$tmp" && dpkg-shlibdeps -O -e"${bins[@]}" 2>"$out/shlibdeps.log" |
  sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { cat "$out/shlibdeps.log"; echo "dpkg-shlibdeps found no Depends" >&2; exit 1; }
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)

sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@DEPENDS@/$depends/" \
  -e "s/@MAINTAINER@/$maintainer/" \
  -e "s/@SIZE@/$size/" "$src/deploy/deb/control.in" >"$root/DEBIAN/control"
(cd "$root" && find etc -type f | sed 's#^#/#' | sort) >"$root/DEBIAN/conffiles"
install -m 0755 "$src/deploy/deb/postinst" "$src/deploy/deb/postrm" "$root/DEBIAN/"
(cd "$root" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' |
  sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "== $deb"
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
if [ "${TANDEM_DEB_LINTIAN:-1}" != 0 ] && command -v lintian >/dev/null; then
  echo "== lintian"
  lintian --info --display-info --pedantic "$deb" || true
fi
