#!/bin/sh
# Build kube-apiserver once, for the tests that run against a real Kubernetes API (tests/kube.py).
#
# No package registry ships a kube-apiserver binary, but Debian bookworm's source package
# `kubernetes` (1.20.2, the full tree with vendor/) builds one with Debian's golang-go. This
# fetches that source by package name with apt-get, applies Debian's patches (dpkg-source does,
# as `apt-get source` unpacks), and builds the one command as debian/rules builds all of them:
# CGO_ENABLED=0, GOPATH inside the tree, `make WHAT=cmd/kube-apiserver`. About 6 minutes on
# 2 cores and 1.3 GB of memory; the build tree (1.8 GB) is removed afterwards.
#
# The binary goes to a cache outside the clone, reused by every clone and never committed:
#   ${CLUSTERHEALTH_CACHE:-/var/cache/clusterhealth}/kube-apiserver-1.20.2/kube-apiserver
# (as a user who cannot write /var/cache: ${XDG_CACHE_HOME:-~/.cache}/clusterhealth). When it is
# there already this does nothing. Its path is printed on the last line.
#
# apt's deb-src source comes from a list of this script's own, under the cache, with apt state of
# its own: the machine's apt sources are not changed. `make kube-apiserver` (and `make test`)
# run this; the Debian packages it needs (golang-go, dpkg-dev) come with `make sysdeps`.
set -eu

VERSION=1.20.2
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ -z "${CLUSTERHEALTH_CACHE:-}" ]; then
    if [ -w /var/cache ] || [ -w /var/cache/clusterhealth ]; then
        CLUSTERHEALTH_CACHE=/var/cache/clusterhealth
    else
        CLUSTERHEALTH_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/clusterhealth
    fi
fi
DEST=$CLUSTERHEALTH_CACHE/kube-apiserver-$VERSION
BIN=$DEST/kube-apiserver

mkdir -p "$DEST"
# Two clones running `make test` at once build it once: the second waits for the first.
exec 9>"$DEST/.lock"
flock 9
if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi

for tool in go dpkg-source apt-get make; do
    command -v $tool >/dev/null 2>&1 || { echo "$0: $tool is missing (make sysdeps)" >&2; exit 1; }
done

work=$DEST/build
rm -rf "$work"
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src"
cat >"$work/apt/sources.list" <<EOF
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bookworm main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR-security bookworm-security main
EOF
apt_opts="-o Dir::Etc::SourceList=$work/apt/sources.list -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists=$work/apt/lists -o Dir::Cache=$work/apt/cache -o Debug::NoLocking=1
  -o APT::Sandbox::User=root"
start=$(date +%s)
# shellcheck disable=SC2086
apt-get $apt_opts -q update
# shellcheck disable=SC2086
(cd "$work/src" && apt-get $apt_opts -q source kubernetes)
tree=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d -name "kubernetes-*$VERSION")
[ -n "$tree" ] || { echo "$0: the source package is not kubernetes $VERSION:" "$work"/src/* >&2; exit 1; }

# What debian/rules' override_dh_auto_build does, for the one command.
cd "$tree"
mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
env GOPATH="$tree/.go" HOME="$work/home" CGO_ENABLED=0 PATH="/usr/lib/go/bin:$PATH" \
    make WHAT=cmd/kube-apiserver
"$tree/_output/bin/kube-apiserver" --version
install -m 0755 "$tree/_output/bin/kube-apiserver" "$BIN.new"
mv -f "$BIN.new" "$BIN"
echo "built $("$BIN" --version) from $(basename "$tree") in $(($(date +%s) - start)) s" >"$DEST/BUILD"
cat "$DEST/BUILD" >&2
cd "$DEST"
rm -rf "$work"
echo "$BIN"
