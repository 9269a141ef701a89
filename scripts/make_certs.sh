#!/usr/bin/env bash
# Make TRIAL credentials for a pfedes deployment: a local certificate authority, a SuperLink
# TLS certificate signed by it, and one SuperNode authentication key pair per device.
# For real deployments use certificates from your own CA (see docs/deployment.md).
#
# usage: scripts/make_certs.sh [OUT_DIR] [NODE_NAME ...]
#   OUT_DIR     default: certs
#   NODE_NAME   default: phone gateway gpu-host
# environment:
#   SUPERLINK_HOSTS  extra DNS names / IPs for the SuperLink certificate, space separated
#                    (localhost, 127.0.0.1, ::1 and the compose service name "superlink"
#                    are always included)
#   CERT_DAYS        validity in days (default 365)
#
# OUT_DIR/
#   ca.crt ca.key                     the trial CA (ca.key never leaves the admin machine)
#   superlink.crt superlink.key       flower-superlink --ssl-ca-certfile ca.crt
#                                     --ssl-certfile superlink.crt --ssl-keyfile superlink.key
#   supernode-keys/NAME, NAME.pub     ECDSA P-384 key pair in OpenSSH format, as flwr expects:
#                                     `flwr supernode register NAME.pub CONNECTION` (admin) and
#                                     `flower-supernode --auth-supernode-private-key NAME` (device)
set -euo pipefail

OUT_DIR="${1:-certs}"
shift || true
if [ "$#" -eq 0 ]; then
  set -- phone gateway gpu-host
fi
DAYS="${CERT_DAYS:-365}"

for tool in openssl ssh-keygen; do
  command -v "$tool" >/dev/null || { echo "make_certs.sh: '$tool' is not installed" >&2; exit 1; }
done
for name in "$@"; do
  case "$name" in
    ''|*[!A-Za-z0-9_-]*) echo "make_certs.sh: node name '$name' may hold only letters, digits, '-' and '_'" >&2; exit 1;;
  esac
done

mkdir -p "$OUT_DIR/supernode-keys"
umask 077

# Subject alternative names: what clients dial must be listed, or TLS verification fails.
san="DNS:localhost,DNS:superlink,IP:127.0.0.1,IP:::1"
for host in ${SUPERLINK_HOSTS:-}; do
  if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then
    san="$san,IP:$host"
  else
    san="$san,DNS:$host"
  fi
done

# 1. The certificate authority (self-signed).
openssl req -x509 -newkey rsa:4096 -sha256 -days "$DAYS" -nodes \
  -keyout "$OUT_DIR/ca.key" -out "$OUT_DIR/ca.crt" \
  -subj "/CN=pfedes trial CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

# 2. The SuperLink's key and certificate, signed by the CA.
openssl req -newkey rsa:4096 -sha256 -nodes \
  -keyout "$OUT_DIR/superlink.key" -out "$OUT_DIR/superlink.csr" \
  -subj "/CN=superlink" 2>/dev/null
extfile="$(mktemp)"
trap 'rm -f "$extfile"' EXIT
cat > "$extfile" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$san
EOF
openssl x509 -req -sha256 -days "$DAYS" -in "$OUT_DIR/superlink.csr" \
  -CA "$OUT_DIR/ca.crt" -CAkey "$OUT_DIR/ca.key" -CAcreateserial \
  -out "$OUT_DIR/superlink.crt" -extfile "$extfile" 2>/dev/null
rm -f "$OUT_DIR/superlink.csr" "$OUT_DIR/ca.srl"

# 3. One authentication key pair per SuperNode: ECDSA on NIST P-384, OpenSSH format.
for name in "$@"; do
  rm -f "$OUT_DIR/supernode-keys/$name" "$OUT_DIR/supernode-keys/$name.pub"
  ssh-keygen -q -t ecdsa -b 384 -N "" -C "pfedes-$name" -f "$OUT_DIR/supernode-keys/$name"
done

# Public parts may be read by anyone (containers run as an unprivileged user).
chmod 644 "$OUT_DIR/ca.crt" "$OUT_DIR/superlink.crt" "$OUT_DIR"/supernode-keys/*.pub
chmod 755 "$OUT_DIR" "$OUT_DIR/supernode-keys"

openssl verify -CAfile "$OUT_DIR/ca.crt" "$OUT_DIR/superlink.crt" >/dev/null
echo "make_certs.sh: wrote $OUT_DIR/{ca.crt,superlink.crt,superlink.key} and supernode-keys/{$(echo "$@" | tr ' ' ',')}"
