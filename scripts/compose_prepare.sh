#!/usr/bin/env bash
# Prepare the host directories that docker/compose.yml mounts, for a trial on one machine:
#   DEPLOY/superlink            SuperLink database (registered nodes, runs)
#   DEPLOY/server-out           ServerApp outputs (metrics, summary, server checkpoint for resume)
#   DEPLOY/<device>/data        that device's train.parquet + test.parquet
#   DEPLOY/<device>/state       that device's private state (backbone, head, projection, optimizer)
# and hand them, and the private keys the containers read, to Flower's container user (49999).
#
# usage: scripts/compose_prepare.sh [--data DIR]
#   --data DIR   copy DIR/train.parquet and DIR/test.parquet to every device (default: the
#                sample shipped in pfedes/sample). Real devices bring their own data instead.
# environment: PFEDES_DEPLOY (default docker/deploy), PFEDES_CERTS (default docker/certs),
#              as in compose.yml (there they are relative to docker/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPLOY="${PFEDES_DEPLOY:-$ROOT/docker/deploy}"
CERTS="${PFEDES_CERTS:-$ROOT/docker/certs}"
DATA="$ROOT/pfedes/sample"
FLWR_UID=49999   # the `app` user of the flwr/* images
DEVICES=(phone gateway gpu-host)

while [ "$#" -gt 0 ]; do
  case "$1" in
    --data) DATA="${2:?--data needs a directory}"; shift 2;;
    *) echo "compose_prepare.sh: unknown argument '$1' (expected --data DIR)" >&2; exit 1;;
  esac
done
for f in train.parquet test.parquet; do
  [ -f "$DATA/$f" ] || { echo "compose_prepare.sh: '$DATA' has no $f" >&2; exit 1; }
done
for f in ca.crt superlink.crt superlink.key; do
  [ -f "$CERTS/$f" ] || { echo "compose_prepare.sh: no $CERTS/$f: run scripts/make_certs.sh $CERTS first" >&2; exit 1; }
done

mkdir -p "$DEPLOY/superlink" "$DEPLOY/server-out"
for device in "${DEVICES[@]}"; do
  [ -f "$CERTS/supernode-keys/$device" ] || { echo "compose_prepare.sh: no key for '$device' in $CERTS/supernode-keys" >&2; exit 1; }
  mkdir -p "$DEPLOY/$device/data" "$DEPLOY/$device/state"
  cp "$DATA/train.parquet" "$DATA/test.parquet" "$DEPLOY/$device/data/"
done

as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo)
"${as_root[@]}" chown -R "$FLWR_UID:$FLWR_UID" "$DEPLOY"
"${as_root[@]}" chown "$FLWR_UID:$FLWR_UID" "$CERTS/superlink.key" "${DEVICES[@]/#/$CERTS/supernode-keys/}"
echo "compose_prepare.sh: $DEPLOY ready for ${DEVICES[*]} (data from $DATA); keys handed to uid $FLWR_UID"
