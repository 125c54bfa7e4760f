#!/bin/sh
# The real-node tier's store: FerretDB over SQLite, speaking the MongoDB wire
# protocol on 27017, as a stand-in for the official MongoDB image in the
# chart's mongodb StatefulSet. It honours the same contract: the data volume
# on /data/db, and the root user from the files named by
# MONGO_INITDB_ROOT_USERNAME_FILE / MONGO_INITDB_ROOT_PASSWORD_FILE, created on
# first start, with authentication enforced (SCRAM). mongod's own flags (the
# chart's args) are ignored.
set -eu
if [ -n "${MONGO_INITDB_ROOT_USERNAME_FILE:-}" ]; then
  FERRETDB_SETUP_USERNAME="$(cat "$MONGO_INITDB_ROOT_USERNAME_FILE")"
  FERRETDB_SETUP_PASSWORD="$(cat "$MONGO_INITDB_ROOT_PASSWORD_FILE")"
  FERRETDB_SETUP_DATABASE=admin
  export FERRETDB_SETUP_USERNAME FERRETDB_SETUP_PASSWORD FERRETDB_SETUP_DATABASE
fi
exec /usr/local/bin/ferretdb --handler=sqlite --sqlite-url=file:/data/db/ \
  --listen-addr=0.0.0.0:27017 --state-dir=/data/db --debug-addr=- \
  --telemetry=disable --log-level=warn --test-enable-new-auth
