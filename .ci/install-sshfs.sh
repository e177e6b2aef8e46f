#!/bin/sh
# Install the system packages the tests need (sshfs, sshd, fusermount3 for the two-client
# tests; strace for fsync fault injection), only if something is missing.
# Idempotent; exits non-zero if anything still is missing afterwards. Needs root (or sudo).
set -eu

have_all() {
    command -v strace >/dev/null 2>&1 &&
        command -v sshfs >/dev/null 2>&1 &&
        [ -x /usr/sbin/sshd ] &&
        { command -v fusermount3 >/dev/null 2>&1 || command -v fusermount >/dev/null 2>&1; }
}

if have_all; then
    echo "install-sshfs: sshfs, sshd, fusermount and strace already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-sshfs: need root or sudo" >&2; exit 1; }
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    sshfs openssh-server fuse3 strace

if ! have_all; then
    echo "install-sshfs: sshfs, /usr/sbin/sshd, fusermount or strace is still missing" >&2
    exit 1
fi
if [ ! -e /dev/fuse ]; then
    echo "install-sshfs: warning: /dev/fuse does not exist; sshfs tests cannot mount here" >&2
fi
echo "install-sshfs: installed sshfs openssh-server fuse3 strace"
