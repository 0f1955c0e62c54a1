#!/usr/bin/env bash
# Install hvgpu's host side into ./.venv (README: `./install.sh && .venv/bin/hvgpu demo`).
#   HVGPU_EXTRA=host          CUDA 12 driver hosts (default)
#   HVGPU_EXTRA=host-cuda13   CUDA 13 driver hosts
# As root on Debian/Ubuntu it installs the system packages libvirt-python
# builds against; elsewhere it says which ones are missing.
set -euo pipefail
cd "$(dirname "$0")"
extra=${HVGPU_EXTRA:-host}
packages="libvirt-dev pkg-config python3-venv python3-dev gcc"

missing=""
for p in $packages; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "install.sh: installing$missing"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
    else
        echo "install.sh: please install:$missing (libvirt-python builds against them)" >&2
        exit 1
    fi
fi
# Executors (the processes that run guests' CUDA work) run as this system user,
# without capabilities (hvgpu agent --executor-user); it needs the GPU's device
# nodes, which some hosts give to group video.
if [ "$(id -u)" = 0 ]; then
    if ! id -u hvgpu >/dev/null 2>&1; then
        echo "install.sh: creating the system user hvgpu for executors"
        useradd --system --no-create-home --shell /usr/sbin/nologin hvgpu
    fi
    if getent group video >/dev/null && [[ " $(id -nG hvgpu) " != *" video "* ]]; then
        usermod -a -G video hvgpu
    fi
else
    echo "install.sh: not root: the agent will run executors as your own user" >&2
fi
[ -x .venv/bin/python ] || python3 -m venv .venv

# pip draws its progress bar only on a terminal (and never with -q). In a log (CI,
# ssh without -t, | tee) each download is said instead, numbered, with the megabytes
# downloaded so far.
downloads() {
    awk '/^ *Downloading .*\((.*B)\)/ {
             s = $0; sub(/.*\(/, "", s); sub(/\).*/, "", s); split(s, a, " ")
             mb = a[2] == "kB" ? a[1] / 1000 : a[2] == "GB" ? a[1] * 1000 : a[1]
             n += 1; total += mb; name = $2; sub(/.*\//, "", name)
             printf "install.sh: download %d: %s (%s), %.1f MB so far\n", n, name, s, total
             fflush(); next }
         /^Requirement already satisfied/ { next }
         { print; fflush() }'
}
echo "install.sh: installing hvgpu[$extra] into .venv: its dependencies are downloaded" \
     "first (CuPy, cuda-bindings and NVIDIA's CUDA wheels are a few hundred MB)"
pip=(.venv/bin/python -m pip install --disable-pip-version-check -e ".[$extra]")
if [ -t 1 ]; then
    "${pip[@]}" --progress-bar on
else
    PYTHONUNBUFFERED=1 "${pip[@]}" --progress-bar off | downloads
fi
if [ "$(id -u)" = 0 ] && ! su -s /bin/sh hvgpu -c "$PWD/.venv/bin/python -c 'import hvgpu'" >/dev/null 2>&1; then
    echo "install.sh: warning: user hvgpu cannot run $PWD/.venv/bin/python (a directory above" \
         "it is not searchable?); the agent refuses to start executors until it can:" \
         "install under /opt, for example" >&2
fi
echo "install.sh: done; try .venv/bin/hvgpu demo"
