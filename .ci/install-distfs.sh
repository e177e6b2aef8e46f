#!/bin/sh
# Install the system packages the distributed-filesystem tests need (GlusterFS server and
# FUSE client; a Ceph mon, mgr, osd, mds and ceph-fuse; radosgw for the S3 tests), only if
# something is missing.
# Idempotent; exits non-zero if anything still is missing afterwards. Needs root (or sudo).
# The fixtures (tests/glusterfs.py, tests/cephfs.py) start everything on 127.0.0.1 from
# their own configuration: no service is enabled or started here.
set -eu

TOOLS="glusterd gluster glusterfs glusterfsd ceph ceph-authtool monmaptool ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse radosgw radosgw-admin"

have_all() {
    for tool in $TOOLS; do
        command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || [ -x "/usr/bin/$tool" ] || return 1
    done
    command -v fusermount3 >/dev/null 2>&1 || command -v fusermount >/dev/null 2>&1
}

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-distfs: need root or sudo" >&2; exit 1; }
    SUDO="sudo"
fi

# glusterd refuses 127.0.0.1 and localhost as a brick's host, but takes another name for
# 127.0.0.1; a container's own host name resolves to its external address instead.
if ! getent hosts castore-gluster 2>/dev/null | grep -q '^127\.0\.0\.1[[:space:]]'; then
    echo "127.0.0.1 castore-gluster" | $SUDO tee -a /etc/hosts >/dev/null ||
        echo "install-distfs: warning: cannot add castore-gluster to /etc/hosts" >&2
fi

if have_all; then
    echo "install-distfs: GlusterFS and Ceph already installed"
    exit 0
fi

$SUDO apt-get update
# policy-rc.d 101: Debian's maintainer scripts must not start glusterd or ceph daemons as
# services: the system-wide glusterd would hold port 24007, which the fixture's own needs.
POLICY=/usr/sbin/policy-rc.d
ADDED_POLICY=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    ADDED_POLICY=1
fi
status=0
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    glusterfs-server glusterfs-client \
    ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph-common radosgw fuse3 || status=$?
if [ -n "$ADDED_POLICY" ]; then
    $SUDO rm -f "$POLICY"
fi
[ "$status" -eq 0 ] || exit "$status"

if ! have_all; then
    echo "install-distfs: a GlusterFS or Ceph tool is still missing (need: $TOOLS)" >&2
    exit 1
fi
if [ ! -e /dev/fuse ]; then
    echo "install-distfs: warning: /dev/fuse does not exist; the GlusterFS and CephFS tests cannot mount here" >&2
fi
echo "install-distfs: installed glusterfs-server glusterfs-client ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph-common"
