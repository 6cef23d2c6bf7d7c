#!/usr/bin/env bash
# The Debian packages the services and their tests need, installed when missing.
#   bubblewrap      the sandbox's default backend
#   python3         the interpreter sandboxed programs run on (Debian's, under /usr)
#   util-linux      prlimit and setpriv, which apply limits and uids to sandboxed programs
#   docker.io       the sandbox's docker backend (its tests start a private engine)
#   prometheus      prometheus and promtool: tests/observability scrapes a training run with a real
#                   Prometheus and checks the alert rules (--no-install-recommends: no exporters)
set -euo pipefail
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
[ -x /usr/bin/python3 ] || need+=(python3)
{ [ -x /usr/bin/prlimit ] && [ -x /usr/bin/setpriv ]; } || need+=(util-linux)
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || need+=(prometheus)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${need[*]}; install them with: sudo apt-get install ${need[*]}" >&2
  exit 1
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
