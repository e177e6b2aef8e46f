#!/bin/sh
# Install Debian's chromium and its chromedriver for castore ui's browser tests (selenium
# drives them; no browser is downloaded at run time), only if either is missing.
# Idempotent; exits non-zero if anything still is missing afterwards. Needs root (or sudo).
set -eu

have_all() {
    command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1
}

if have_all; then
    echo "install-chromium: chromium and chromedriver already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-chromium: need root or sudo" >&2; exit 1; }
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    chromium chromium-driver fonts-dejavu-core

if ! have_all; then
    echo "install-chromium: chromium or chromedriver still missing after apt-get install" >&2
    exit 1
fi
echo "install-chromium: installed chromium and chromedriver"
