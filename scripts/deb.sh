#!/usr/bin/env bash
# The Debian package, end to end: builds it with cargo-deb from the build
# that is already there (the dev profile by default: the suite has just
# built it; MINTGATE_DEB_PROFILE=release for a release package), checks its
# contents, installs it (dpkg -i, as root), runs the installed
# /usr/bin/mintgate as the mintgate user against /etc/mintgate/mintgate.toml
# the way the systemd unit does (NOTIFY_SOCKET on a socket bound here: READY=1
# and WATCHDOG=1 must arrive; then a CoAP GET and /readyz answer), and
# purges it, leaving the machine as it found it.
#
#   scripts/deb.sh              # build, check, install, run, purge
#   scripts/deb.sh --build-only # build and check the .deb only (no root)
#
# Needs: cargo-deb (installed here, pinned, when missing), dpkg, python3.
# Under MINTGATE_REQUIRE_PEERS=1 a part it cannot do is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
PROFILE="${MINTGATE_DEB_PROFILE:-dev}"
build_only=false
[ "${1:-}" = "--build-only" ] && build_only=true

fail() { echo "deb.sh: $*" >&2; exit 1; }
skip() {
  if [ "${MINTGATE_REQUIRE_PEERS:-0}" = 1 ]; then fail "$* (MINTGATE_REQUIRE_PEERS=1)"; fi
  echo "deb.sh: skipping: $*"; exit 0
}

export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if ! cargo deb --version 2>/dev/null | grep -qx "cargo-deb $CARGO_DEB_VERSION"; then
  echo "deb.sh: installing cargo-deb $CARGO_DEB_VERSION"
  cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION"
fi

target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
case "$PROFILE" in dev | debug) out="$target/debug" ;; *) out="$target/$PROFILE" ;; esac

# the binary (a no-op after the suite's build), then what the package takes
# from it: completions and manual pages, where the assets of
# crates/mintgate-cli/Cargo.toml look (target/release/ stands for $out)
# default features: the gateway without the labs
cargo build --quiet -p mintgate-cli --bin mintgate --profile "$PROFILE"
rm -rf "$out/pkg" && mkdir -p "$out/pkg"
"$out/mintgate" completions bash >"$out/pkg/mintgate.bash"
"$out/mintgate" completions zsh >"$out/pkg/_mintgate"
"$out/mintgate" completions fish >"$out/pkg/mintgate.fish"
"$out/mintgate" man --dir "$out/pkg/man1"
# compressed as Debian policy asks (cargo-deb leaves files of target/ as they are)
gzip -n -9 "$out"/pkg/man1/*.1

mkdir -p target/deb
rm -f target/deb/mintgate_*.deb
# cargo-deb warns that the dev profile is meant for testing, not releases
cargo deb -p mintgate-cli --no-build --profile "$PROFILE" --fast -o target/deb/ 2>&1 |
  grep -v "dev profile is not supported\|cargo-deb is for making releases\|To enable debug symbols\|Cargo also supports custom profiles" || true
deb=$(ls target/deb/mintgate_*.deb 2>/dev/null | head -1)
[ -n "$deb" ] || fail "cargo deb made no package"
echo "deb.sh: built $deb ($(du -h "$deb" | cut -f1))"

# contents
info=$(dpkg-deb -I "$deb")
files=$(dpkg-deb -c "$deb" | awk '{print $6}')
conffiles=$(dpkg-deb -I "$deb" conffiles)
postinst=$(dpkg-deb -I "$deb" postinst)
has() { grep -qx -- "$2" <<<"$1" || fail "not in the package: $2"; }
grep -q '^ Package: mintgate$' <<<"$info" || fail "package name: $info"
grep -q '^ Depends:.*adduser' <<<"$info" || fail "no Depends on adduser: $info"
for f in ./usr/bin/mintgate ./etc/mintgate/mintgate.toml \
  ./usr/share/bash-completion/completions/mintgate \
  ./usr/share/zsh/vendor-completions/_mintgate \
  ./usr/share/fish/vendor_completions.d/mintgate.fish \
  ./usr/share/man/man1/mintgate.1.gz ./usr/share/man/man1/mintgate-serve.1.gz \
  ./usr/share/doc/mintgate/copyright; do
  has "$files" "$f"
done
grep -Eq '^\./(usr/)?lib/systemd/system/mintgate\.service$' <<<"$files" || fail "no systemd unit in the package"
has "$conffiles" /etc/mintgate/mintgate.toml
grep -q 'adduser --system' <<<"$postinst" || fail "postinst makes no system user"
grep -q 'deb-systemd-helper' <<<"$postinst" || fail "postinst does not enable the unit"
echo "deb.sh: contents checked (binary, conffile, unit, manual pages, completions, postinst)"
$build_only && exit 0

# install, run, purge: as root, on a machine without the package
[ "$(id -u)" = 0 ] || skip "installing needs root"
if dpkg-query -W -f='${Status}' mintgate 2>/dev/null | grep -q "ok installed"; then
  skip "a mintgate package is installed here already; not touching it"
fi
for p in 5683/udp 9464/tcp 8080/tcp; do
  if ss -Hln --"${p#*/}" "sport = :${p%/*}" | grep -q .; then
    fail "port $p is taken (a gateway left running?): the installed configuration needs it"
  fi
done
user_existed=false
getent passwd mintgate >/dev/null && user_existed=true
work=$(mktemp -d)
gw=""
cleanup() {
  [ -n "$gw" ] && kill "$gw" 2>/dev/null && wait "$gw" 2>/dev/null
  [ -n "${listener:-}" ] && kill "$listener" 2>/dev/null
  if dpkg-query -W -f='${Status}' mintgate 2>/dev/null | grep -q "installed"; then
    dpkg -P mintgate >/dev/null || true
  fi
  if ! $user_existed && getent passwd mintgate >/dev/null; then
    deluser --system mintgate >/dev/null 2>&1 || userdel mintgate || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

dpkg -i "$deb" >/dev/null
getent passwd mintgate >/dev/null || fail "no mintgate user after install"
perm=$(stat -c '%U:%G %a' /etc/mintgate/mintgate.toml)
[ "$perm" = "root:mintgate 640" ] || fail "/etc/mintgate/mintgate.toml is $perm, not root:mintgate 640"
[ "$(stat -c '%U %a' /var/lib/mintgate)" = "mintgate 750" ] || fail "/var/lib/mintgate: $(stat -c '%U %a' /var/lib/mintgate)"
if command -v systemd-analyze >/dev/null; then
  unit=$(ls /usr/lib/systemd/system/mintgate.service /lib/systemd/system/mintgate.service 2>/dev/null | head -1)
  systemd-analyze verify "$unit" || fail "systemd-analyze verify $unit"
fi

# the service manager's side: a datagram socket the gateway may write to
chmod 755 "$work"
sock="$work/notify.sock"
python3 - "$sock" >"$work/notify.log" <<'EOF' &
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o666)
s.settimeout(60)
while True:
    try:
        m = s.recv(4096)
    except socket.timeout:
        break
    print(m.decode().replace("\n", " ").strip(), flush=True)
EOF
listener=$!
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done

# as the unit runs it: user mintgate, in its state folder, RLIMIT_RTPRIO 50
# (LimitRTPRIO=) where this machine lets root raise it (a container
# without CAP_SYS_RESOURCE does not)
rtprio=(prlimit --rtprio=50:50 --)
"${rtprio[@]}" true 2>/dev/null || rtprio=()
(
  cd /var/lib/mintgate
  export NOTIFY_SOCKET="$sock" WATCHDOG_USEC=1000000
  exec "${rtprio[@]}" \
    setpriv --reuid=mintgate --regid=mintgate --init-groups \
    sh -c 'export WATCHDOG_PID=$$; exec /usr/bin/mintgate serve --config /etc/mintgate/mintgate.toml'
) 2>"$work/serve.log" &
gw=$!
ready=false
for _ in $(seq 200); do
  if grep -q "READY=1" "$work/notify.log"; then ready=true; break; fi
  kill -0 "$gw" 2>/dev/null || break
  sleep 0.1
done
$ready || { cat "$work/serve.log" >&2; fail "no READY=1 from the installed gateway"; }
echo "deb.sh: notified: $(grep READY=1 "$work/notify.log")"
answer=$(/usr/bin/mintgate get coap://127.0.0.1/request)
[ "$answer" = "hello world" ] || fail "CoAP GET /request answered '$answer'"
for port in 9464 8080; do
  code=$(curl -s -o "$work/readyz" -w '%{http_code}' "http://127.0.0.1:$port/readyz")
  [ "$code" = 200 ] || fail "/readyz on $port: $code $(cat "$work/readyz")"
done
for _ in $(seq 40); do grep -q "WATCHDOG=1" "$work/notify.log" && break; sleep 0.1; done
grep -q "WATCHDOG=1" "$work/notify.log" || fail "no WATCHDOG=1 within 4 s"
grep -o 'worker_priority=[^ ]*' "$work/serve.log" | sed 's/^/deb.sh: direct path /'
# a write from loopback is taken, as the installed configuration says
/usr/bin/mintgate put coap://127.0.0.1/actuators/led0 -e 1 >/dev/null || fail "loopback PUT refused"
kill -TERM "$gw"
wait "$gw" || fail "the gateway did not stop cleanly on SIGTERM: $(tail -5 "$work/serve.log")"
gw=""
grep -q "STOPPING=1" "$work/notify.log" || fail "no STOPPING=1"
echo "deb.sh: the installed gateway served CoAP and /readyz, pinged the watchdog and stopped on SIGTERM"

dpkg -P mintgate >/dev/null
for f in /usr/bin/mintgate /etc/mintgate /var/lib/mintgate \
  /etc/systemd/system/multi-user.target.wants/mintgate.service; do
  [ ! -e "$f" ] || fail "$f left after dpkg -P"
done
echo "deb.sh: purged; machine left as found"
