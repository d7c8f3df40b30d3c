#!/bin/sh
# install-deps.sh: installs the Debian packages dsv4cp needs, only those missing (needs root or sudo).
# Called by `make test`, `make demo` and `make bench`; does nothing when everything is present.
set -e
PKGS="gcc make libopenblas-openmp-dev libcjson-dev libopenmpi-dev openmpi-bin python3 python3-torch python3-numpy python3-mpi4py python3-matplotlib"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $missing
