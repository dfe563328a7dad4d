#!/usr/bin/env bash
# Installs the servers lockbench starts (from Debian's packages) if they are
# missing. As root it installs them; otherwise it prints the exact command
# and exits non-zero. Sourced by compare.sh and test.sh; safe to run again.
set -euo pipefail

missing=()
have() { command -v "$1" >/dev/null 2>&1; }
have redis-server || missing+=(redis-server)
have redis-sentinel || missing+=(redis-sentinel)
# `redis-cli --cluster create` forms the Redis Cluster.
have redis-cli || missing+=(redis-tools)
# The partition fault's drop rules.
have nft || missing+=(nftables)
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || missing+=(postgresql)
have psql || missing+=(postgresql-client)
have faketime || missing+=(faketime)
# The TLS tests make a throwaway CA and server certificates.
have openssl || missing+=(openssl)
have etcd || missing+=(etcd-server)
have protoc || missing+=(protobuf-compiler)
have gcc || missing+=(gcc)
# ZooKeeper runs as a plain Java process from the package's jar; the
# package depends on a JRE, but check `java` itself on a minimal machine.
[[ -f /usr/share/java/zookeeper.jar ]] || missing+=(zookeeper)
have java || missing+=(default-jre-headless)
# The report's browser test loads the page in headless Chromium.
have chromium || missing+=(chromium)

if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "lockbench setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  elif sudo -n true 2>/dev/null; then
    echo "lockbench setup: installing ${missing[*]} with sudo" >&2
    sudo DEBIAN_FRONTEND=noninteractive apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "lockbench needs these Debian packages; install them with:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

# Debian starts the packaged services on install. lockbench never uses them
# (it starts its own servers on 127.0.0.N and non-default ports), so stop
# them to keep the machine quiet; ignore failures where there is no init.
if [[ $(id -u) -eq 0 ]] && have service; then
  for s in redis-server redis-sentinel postgresql zookeeper etcd; do
    service "$s" stop >/dev/null 2>&1 || true
  done
fi
