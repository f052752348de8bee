#!/usr/bin/env bash
# check_units.sh: keeps deploy/ from rotting. Checks, for the systemd units and example configs:
#   1. every unit has the keys the deployment relies on (grep; always);
#   2. `systemd-analyze verify` finds nothing wrong with them (when systemd-analyze exists; the
#      only message it may print is that /usr/local/bin/tandem-* is not installed here);
#   3. every key in deploy/*.ini is an option of its daemon (grep of the option tables);
#   4. each daemon built in BUILD_DIR (when given) accepts its example config: run with the
#      config, a throw-away cluster secret as a systemd credential and a missing model, it must get
#      as far as loading the model.
# usage: check_units.sh SOURCE_ROOT [BUILD_DIR]
set -uo pipefail

src=${1:?usage: check_units.sh SOURCE_ROOT [BUILD_DIR]}
build=${2:-}
dep=$src/deploy
fail=0
err() {
  echo "FAIL: $*"
  fail=1
}

units=("$dep/tandem-router.service" "$dep/tandem-prefill@.service" "$dep/tandem-decode@.service")
for f in "${units[@]}" "$dep/tandem.target" "$dep/router.ini" "$dep/prefill.ini" \
  "$dep/decode.ini" "$dep/README.md"; do
  [ -f "$f" ] || err "$f is missing"
done
[ "$fail" = 0 ] || exit 1

# ---- 1. required keys -------------------------------------------------------------------------
need() { # need FILE LINE...: each LINE must appear as a whole line
  local f=$1
  shift
  for line in "$@"; do
    grep -qxF -- "$line" "$f" || err "$(basename "$f"): no line '$line'"
  done
}
for u in "${units[@]}"; do
  need "$u" Type=notify NotifyAccess=main WatchdogSec=30 Restart=on-failure \
    LimitMEMLOCK=infinity DynamicUser=yes KillSignal=SIGTERM TimeoutStopSec=30 \
    LoadCredential=cluster-secret:/etc/tandem/cluster-secret ProtectSystem=strict \
    ProtectHome=yes PrivateTmp=yes NoNewPrivileges=yes \
    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK" PartOf=tandem.target \
    WantedBy=tandem.target
  grep -q '^StateDirectory=.' "$u" || err "$(basename "$u"): no StateDirectory="
  grep -q '^CacheDirectory=.' "$u" || err "$(basename "$u"): no CacheDirectory="
  # UCX patches code at run time (memory hooks): W^X would break it
  if grep -q '^MemoryDenyWriteExecute=yes' "$u"; then
    err "$(basename "$u"): MemoryDenyWriteExecute=yes breaks UCX"
  fi
done
need "$dep/tandem-router.service" \
  "ExecStart=/usr/local/bin/tandem-router --config /etc/tandem/router.ini"
for role in prefill decode; do
  need "$dep/tandem-$role@.service" \
    "ExecStart=/usr/local/bin/tandem-$role --config /etc/tandem/$role-%i.ini --id=%i" \
    "StateDirectory=tandem-$role-%i" "CacheDirectory=tandem-$role-%i"
done
need "$dep/tandem.target" WantedBy=multi-user.target
# the ExecStart programs are the ones meson installs
for role in router prefill decode; do
  grep -q "executable('tandem-$role'" "$src/$role/meson.build" ||
    err "$role/meson.build builds no tandem-$role (the units run /usr/local/bin/tandem-$role)"
done

# ---- 2. systemd-analyze verify ----------------------------------------------------------------
if command -v systemd-analyze >/dev/null 2>&1; then
  out=$(systemd-analyze verify --man=no "${units[@]}" "$dep/tandem.target" 2>&1)
  # Only messages about our units count (a container may add noise about the host); of those,
  # only the missing installed binaries are expected.
  bad=$(printf '%s\n' "$out" | grep -i 'tandem' |
    grep -vE 'Command /usr/local/bin/tandem-(router|prefill|decode) is not executable: No such file or directory')
  if [ -n "$bad" ]; then
    err "systemd-analyze verify:"
    printf '%s\n' "$bad"
  fi
else
  echo "note: systemd-analyze not installed; checked the units with grep only"
fi

# ---- 3. ini keys are options of their daemon ---------------------------------------------------
ini_keys() { # section.key for every assignment in an INI file
  awk '/^[ \t]*[#;]/ || /^[ \t]*$/ { next }
       /^[ \t]*\[/ { s = $0; gsub(/[][ \t]/, "", s); next }
       /=/ { k = $0; sub(/[ \t]*=.*/, "", k); gsub(/[ \t]/, "", k); print (s == "" ? k : s "." k) }' "$1"
}
check_ini() { # check_ini INI SOURCE_DIR...
  local ini=$1
  shift
  local keys
  keys=$(ini_keys "$ini")
  [ -n "$keys" ] || err "$(basename "$ini"): no keys"
  for k in $keys; do
    grep -rqF "{\"$k\", TD_OPT_" "$@" --include='*.c' ||
      err "$(basename "$ini"): '$k' is not an option of the daemon (no {\"$k\", TD_OPT_ in $*)"
  done
}
check_ini "$dep/router.ini" "$src/router"
check_ini "$dep/prefill.ini" "$src/common/worker" "$src/prefill"
check_ini "$dep/decode.ini" "$src/common/worker" "$src/decode"

# ---- 4. the built daemons accept the example configs ---------------------------------------------
if [ -n "$build" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/cluster-secret"
  for role in router prefill decode; do
    exe=$build/$role/tandem-$role
    if [ ! -x "$exe" ]; then
      echo "note: $exe not built; skipped its config check"
      continue
    fi
    out=$(CREDENTIALS_DIRECTORY=$tmp timeout 20 "$exe" --config "$dep/$role.ini" \
      --model="$tmp/no-such-model" 2>&1)
    if ! printf '%s' "$out" | grep -q "no-such-model" || printf '%s' "$out" | grep -q '\.ini'; then
      err "tandem-$role --config deploy/$role.ini did not get as far as loading the model:"
      printf '%s\n' "$out" | head -5
    fi
  done
fi

[ "$fail" = 0 ] && echo "deploy units and configs: ok"
exit "$fail"
