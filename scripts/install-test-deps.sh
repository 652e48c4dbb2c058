#!/usr/bin/env bash
# Installs and starts what the tests need, skipping whatever is already there:
# a Rust toolchain (must exist), librdkafka's build prerequisites, Redis on
# 127.0.0.1:6379, PostgreSQL on 127.0.0.1:5432 with wal_level=logical,
# clickhouse-server, Trino (cached under $SLESS_CACHE), chromium, the Python clients of tests/requirements.txt,
# the npm packages of tests/js, and the brokers `cargo bench --bench brokers`
# compares with: RabbitMQ on 127.0.0.1:5672 (guest/guest) and NATS with
# JetStream on 127.0.0.1:4222; nginx and wrk for `--bench gateway`.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*"; }

if ! command -v cargo >/dev/null; then
  echo "cargo is required (https://rustup.rs)" >&2
  exit 1
fi
# The suite checks formatting and clippy's lints first.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  log "adding rustfmt and clippy to the toolchain"
  rustup component add rustfmt clippy
fi

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=
apt_install() {
  if [ -z "$apt_updated" ]; then
    as_root apt-get update -qq
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Build prerequisites of librdkafka (bundled C source, built by the rdkafka
# crate): make, pkg-config and the OpenSSL and zlib headers.
if ! command -v make >/dev/null || ! command -v pkg-config >/dev/null \
  || ! pkg-config --exists openssl zlib 2>/dev/null; then
  log "installing build prerequisites"
  apt_install make pkg-config libssl-dev zlib1g-dev
fi

# `ip` (iproute2): the replicas' fault test makes network namespaces, a
# bridge and veth pairs with it, as the local cluster does.
if ! command -v ip >/dev/null; then
  log "installing iproute2"
  apt_install iproute2
fi

# Redis: the control plane's shared store, and redis-benchmark for bench/.
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  log "installing Redis"
  apt_install redis-server redis-tools
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  log "starting Redis on 127.0.0.1:6379"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /tmp --logfile /tmp/sless-test-redis.log
  for _ in $(seq 50); do
    redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null
fi
# PostgreSQL: source and sink of the dataflow tests, on 127.0.0.1:5432 with
# the role postgres and the database test, trusted from loopback.
if ! command -v pg_ctlcluster >/dev/null; then
  log "installing PostgreSQL"
  apt_install postgresql postgresql-client
fi
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  log "starting PostgreSQL"
  cluster=$(ls /etc/postgresql | sort -V | tail -n 1)
  conf=/etc/postgresql/$cluster/main
  if ! grep -q "sless-tests" "$conf/pg_hba.conf"; then
    printf '# sless-tests\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n' | \
      cat - "$conf/pg_hba.conf" | as_root tee "$conf/pg_hba.conf.new" >/dev/null
    as_root mv "$conf/pg_hba.conf.new" "$conf/pg_hba.conf"
  fi
  as_root pg_ctlcluster --skip-systemctl-redirect "$cluster" main start
  for _ in $(seq 50); do
    pg_isready -q -h 127.0.0.1 -p 5432 && break
    sleep 0.2
  done
fi
if ! psql "postgres://postgres@127.0.0.1/test" -qc 'SELECT 1' >/dev/null 2>&1; then
  as_root su postgres -c "psql -qc 'CREATE DATABASE test'" >/dev/null 2>&1 || true
fi
psql "postgres://postgres@127.0.0.1/test" -qc 'SELECT 1' >/dev/null
# The role sless_password signs in by password (the first matching line of
# pg_hba.conf wins): tests give it a wrong one.
conf=/etc/postgresql/$(ls /etc/postgresql | sort -V | tail -n 1)/main
if ! grep -q "sless-tests-password" "$conf/pg_hba.conf"; then
  printf '# sless-tests-password\nhost all sless_password 127.0.0.1/32 scram-sha-256\n' | \
    cat - "$conf/pg_hba.conf" | as_root tee "$conf/pg_hba.conf.new" >/dev/null
  as_root mv "$conf/pg_hba.conf.new" "$conf/pg_hba.conf"
  psql "postgres://postgres@127.0.0.1/test" -qc 'SELECT pg_reload_conf()' >/dev/null
fi
# Change data capture (postgresql-cdc) needs logical decoding; a slot per
# capturing test, with room for those a failed test leaves behind (the
# default of 10 would fail every later test after a few).
pg_setting() { psql "postgres://postgres@127.0.0.1/test" -Atc "SHOW $1"; }
if [ "$(pg_setting wal_level)" != logical ] || [ "$(pg_setting max_replication_slots)" -lt 40 ]; then
  log "switching PostgreSQL to wal_level=logical with 40 replication slots"
  psql "postgres://postgres@127.0.0.1/test" -qc 'ALTER SYSTEM SET wal_level = logical' >/dev/null
  psql "postgres://postgres@127.0.0.1/test" -qc 'ALTER SYSTEM SET max_replication_slots = 40' >/dev/null
  psql "postgres://postgres@127.0.0.1/test" -qc 'ALTER SYSTEM SET max_wal_senders = 40' >/dev/null
  cluster=$(ls /etc/postgresql | sort -V | tail -n 1)
  as_root pg_ctlcluster --skip-systemctl-redirect "$cluster" main restart
  for _ in $(seq 50); do
    pg_isready -q -h 127.0.0.1 -p 5432 && break
    sleep 0.2
  done
  [ "$(pg_setting wal_level)" = logical ]
fi

# ClickHouse: source and sink of the dataflow tests; each test starts its own
# server on a free port, so only the package is needed (Debian's 18.16.1).
if ! command -v clickhouse-server >/dev/null; then
  log "installing ClickHouse"
  apt_install clickhouse-server
fi

# Trino: source and sink of the dataflow tests; each test binary starts one
# server on free loopback ports (crates/testkit/src/trino.rs). 476 is the last
# release on Maven Central (later ones are published elsewhere); it needs Java
# 24 or newer, so it runs on the Temurin 25 JDK, set for Trino alone. Cached
# outside the checkout, keyed by version, with only the plugins the tests use
# (the full server is 820 MB packed and 1.9 GB unpacked).
TRINO_VERSION=476
TRINO_HOME=${SLESS_CACHE:-$HOME/.cache/sless}/trino-$TRINO_VERSION
TRINO_PLUGINS="memory postgresql geospatial iceberg password-authenticators"
if [ ! -e "$TRINO_HOME/.complete" ]; then
  if ! command -v mvn >/dev/null; then
    log "installing Maven"
    apt_install maven
  fi
  log "fetching Trino $TRINO_VERSION"
  fetch=$(mktemp -d)
  trap 'rm -rf "$fetch"' EXIT
  mvn -B -q dependency:copy -Dartifact="io.trino:trino-server:$TRINO_VERSION:tar.gz" \
    -DoutputDirectory="$fetch" -Dmaven.repo.local="$fetch/m2"
  rm -rf "$TRINO_HOME" && mkdir -p "$TRINO_HOME"
  # The tarball hard-links jars shared by plugins: unpack whole, then prune.
  tar xzf "$fetch/trino-server-$TRINO_VERSION.tar.gz" -C "$TRINO_HOME" --strip-components=1
  for plugin in "$TRINO_HOME"/plugin/*; do
    case " $TRINO_PLUGINS " in *" ${plugin##*/} "*) ;; *) rm -rf "$plugin" ;; esac
  done
  rm -rf "$fetch"
  trap - EXIT
  touch "$TRINO_HOME/.complete"
fi
if [ ! -x "${SLESS_TRINO_JAVA_HOME:-/usr/lib/jvm/temurin-25-jdk-amd64}/bin/java" ]; then
  echo "warning: Trino $TRINO_VERSION needs Java 24 or newer, the Temurin 25 JDK at" \
    "/usr/lib/jvm/temurin-25-jdk-amd64 or SLESS_TRINO_JAVA_HOME: the Trino tests will fail" >&2
fi

# Nessie, the Iceberg REST catalog the nessie connector is tested against
# (crates/testkit/src/nessie.rs), with moto's S3 server as its object store.
# 0.99.0 is the newest nessie-quarkus runner Maven Central serves here; it
# needs Java 21 or newer, so it runs on the Temurin 25 JDK as Trino does.
NESSIE_VERSION=0.99.0
NESSIE_HOME=${SLESS_CACHE:-$HOME/.cache/sless}/nessie-$NESSIE_VERSION
if [ ! -e "$NESSIE_HOME/.complete" ]; then
  if ! command -v mvn >/dev/null; then
    log "installing Maven"
    apt_install maven
  fi
  log "fetching Nessie $NESSIE_VERSION"
  fetch=$(mktemp -d)
  trap 'rm -rf "$fetch"' EXIT
  mvn -B -q dependency:copy \
    -Dartifact="org.projectnessie.nessie:nessie-quarkus:$NESSIE_VERSION:jar:runner" \
    -DoutputDirectory="$fetch" -Dmaven.repo.local="$fetch/m2"
  rm -rf "$NESSIE_HOME" && mkdir -p "$NESSIE_HOME"
  mv "$fetch/nessie-quarkus-$NESSIE_VERSION-runner.jar" "$NESSIE_HOME/nessie-quarkus-runner.jar"
  rm -rf "$fetch"
  trap - EXIT
  touch "$NESSIE_HOME/.complete"
fi

# Python clients for the end-to-end tests: boto3, awscli v1, moto (reference SQS).
if ! python3 -m pip --version >/dev/null 2>&1; then
  log "installing pip"
  apt_install python3-pip
fi
log "installing Python test requirements"
python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
# New console scripts (aws, terraform, kubectl, celery) need shims under pyenv.
if command -v pyenv >/dev/null; then pyenv rehash; fi

# The AWS SDK for JavaScript v3 of the SDK tests, on the machine's Node.js.
if ! command -v npm >/dev/null; then
  log "installing Node.js"
  apt_install nodejs npm
fi
# Debian's chromium, driven by playwright-core through the web console.
if ! command -v chromium >/dev/null; then
  log "installing chromium"
  apt_install chromium
fi
log "installing the JavaScript test packages"
npm ci --prefix tests/js --no-audit --no-fund --loglevel=error

# The peers of bench/brokers.rs and bench/gateway.rs (the tests do not use them).
if ! command -v rabbitmq-server >/dev/null || ! command -v nats-server >/dev/null \
  || ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
  log "installing RabbitMQ, NATS, nginx and wrk"
  apt_install rabbitmq-server nats-server nginx wrk
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then
  log "starting RabbitMQ on 127.0.0.1:5672"
  as_root env RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 rabbitmq-server -detached
  for _ in $(seq 150); do
    (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null && break
    sleep 0.2
  done
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; then
  log "starting NATS with JetStream on 127.0.0.1:4222"
  mkdir -p /tmp/sless-nats
  setsid nats-server -a 127.0.0.1 -p 4222 -js -sd /tmp/sless-nats -l /tmp/sless-nats.log </dev/null >/dev/null 2>&1 &
  for _ in $(seq 50); do
    (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null && break
    sleep 0.1
  done
fi

log "test dependencies ready"
