#!/usr/bin/env bash
# Install (Debian's packages) and start a local PostgreSQL for the distributed-tuning test; idempotent.
# Prints the database URL on its last line. Needs root, as CI and the dev machines have.
set -euo pipefail
if ! command -v pg_lsclusters >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
read -r version cluster _ <<<"$(pg_lsclusters --no-header | head -n 1)"
pg_ctlcluster "$version" "$cluster" start 2>/dev/null || true
for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 && break; sleep 0.5; done
su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='chunkbench'\"" | grep -q 1 ||
  su postgres -c "psql -qc \"CREATE ROLE chunkbench LOGIN PASSWORD 'chunkbench'\""
su postgres -c "psql -qtAc \"SELECT 1 FROM pg_database WHERE datname='chunkbench_test'\"" | grep -q 1 ||
  su postgres -c "psql -qc \"CREATE DATABASE chunkbench_test OWNER chunkbench\""
echo "postgresql+psycopg://chunkbench:chunkbench@127.0.0.1/chunkbench_test"
