#!/usr/bin/env bash
# What NVMe/TCP TLS costs the data path: one target (one reactor, null namespace) with a
# plain listener and a secure_channel = "required" listener on the same subsystem, and
# `trellis bench` against each in turn, A B A B, so both see the same machine regime
# (these VMs flip between fast and slow from process to process: quote ratios of pairs,
# never absolute figures). Target on CPU 1, bench on CPU 0.
#
#   bench/tls-cost.sh [--reps N] [--runtime S] [--out DIR]
#
# Workloads: 4 KiB randread QD32 and 128 KiB read QD8 (issue: "TLS on against off, 4 KiB
# QD32 and 128 KiB, one reactor"), both suites' keys (SHA-256: TLS_AES_128_GCM_SHA256;
# SHA-384: TLS_AES_256_GCM_SHA384). Writes DIR/tls-cost.json and prints per workload and
# suite the median of the pairs' TLS/plain IOPS ratios. env: TRELLIS (default
# target/release/trellis).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=4 runtime=4 out=""
while [ $# -gt 0 ]; do
  case $1 in
    --reps) reps=${2:?}; shift ;;
    --runtime) runtime=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "tls-cost.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
bin=${TRELLIS:-target/release/trellis}
[ -x "$bin" ] || { echo "tls-cost.sh: $bin not found: cargo build --release -p trellis-cli, or set TRELLIS" >&2; exit 2; }
out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/trellis-tls-cost.XXXXXX")}
mkdir -p "$out"
# shellcheck source=../tests/bench-lib.sh
. tests/bench-lib.sh
plain=$(free_port 15470)
tls=$(free_port $((plain + 1)))
nqn=nqn.2026-11.io.trellis:tlscost
host=nqn.2026-11.io.trellis:tlscost-host
# Any valid keys will do (the interchange format with its CRC-32); the same as the VM test's.
key256="NVMeTLSkey-1:01:Ggh0ZeTr4gtcM5ttLtzjFKTkCEGwn/dvDUPXq4L9i7yv4BH+:"
key384="NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:"
target() { # KEY: the host's key for this target run
  # Private, as the target requires of a file that holds keys (docs/security.md).
  : >"$out/target.toml" && chmod 600 "$out/target.toml"
  cat >"$out/target.toml" <<EOF
[target]
reactors = 1
cpus = [1]
state_dir = "$out/state"

[[listener]]
addr = "127.0.0.1:$plain"

[[listener]]
addr = "127.0.0.1:$tls"
secure_channel = "optional"

[[subsystem]]
nqn = "$nqn"

[[subsystem.host]]
nqn = "$host"
tls_key = "$1"

[[subsystem.namespace]]
backend = "null"
size = "16GiB"
EOF
  "$bin" target --config "$out/target.toml" >"$out/target.log" 2>&1 &
  tpid=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$tls") 2>/dev/null && return 0
    kill -0 $tpid 2>/dev/null || { cat "$out/target.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "tls-cost.sh: the target did not listen" >&2; exit 1
}
one() { # PORT KEY|"" RW BS QD FILE
  local tlsarg=()
  [ -n "$2" ] && tlsarg=(--tls-key "$2")
  "$bin" bench --addr "127.0.0.1:$1" --nqn "$nqn" --hostnqn "$host" ${tlsarg[@]+"${tlsarg[@]}"} \
    --rw "$3" --bs "$4" --iodepth "$5" --runtime "${runtime}s" --ramp_time 1s --cpus 0 \
    --no_progress --json "$6" >/dev/null
}
trap 'kill ${tpid:-0} 2>/dev/null || true' EXIT
for suite in sha256 sha384; do
  key=$key256; [ $suite = sha384 ] && key=$key384
  target "$key"
  for w in "randread 4k 32" "read 128k 8"; do
    set -- $w
    for r in $(seq "$reps"); do
      # Alternate which goes first.
      if [ $((r % 2)) = 1 ]; then order="plain tls"; else order="tls plain"; fi
      for m in $order; do
        f="$out/$suite-$1-$2-$r-$m.json"
        if [ $m = plain ]; then one "$plain" "" "$1" "$2" "$3" "$f"; else one "$tls" "$key" "$1" "$2" "$3" "$f"; fi
      done
    done
  done
  kill $tpid; wait $tpid || true
done
trap - EXIT
python3 - "$out" "$reps" <<'PY'
import glob, json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rows = []
for suite in ("sha256", "sha384"):
    for rw, bs in (("randread", "4k"), ("read", "128k")):
        ratios, p, t = [], [], []
        for r in range(1, reps + 1):
            a = json.load(open(f"{out}/{suite}-{rw}-{bs}-{r}-plain.json"))["jobs"][0]["iops"]
            b = json.load(open(f"{out}/{suite}-{rw}-{bs}-{r}-tls.json"))["jobs"][0]["iops"]
            ratios.append(b / a); p.append(a); t.append(b)
        row = {"suite": suite, "rw": rw, "bs": bs, "plain_iops": p, "tls_iops": t,
               "tls_over_plain": [round(x, 3) for x in ratios],
               "median_ratio": round(statistics.median(ratios), 3)}
        rows.append(row)
        print(f"{suite} {rw} {bs}: TLS/plain IOPS median {row['median_ratio']} "
              f"(pairs {', '.join(f'{x:.3f}' for x in ratios)}; plain median {statistics.median(p):.0f}, TLS {statistics.median(t):.0f})")
json.dump({"rows": rows}, open(f"{out}/tls-cost.json", "w"), indent=1)
print(f"wrote {out}/tls-cost.json")
PY
