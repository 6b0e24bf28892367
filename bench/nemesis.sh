#!/usr/bin/env bash
# The long form of the HA pair's fault harness (issue 37 item 6;
# crates/app/cli/tests/nemesis.rs, docs/target.md "Fault harness"): by
# default 200 faults against the file store and 200 against etcd, with
# network partitions (needs root and nft) and etcd required. Writes each
# run's report to DIR/nemesis-file.json and DIR/nemesis-etcd.json, and the
# whole log to DIR/nemesis-STORE.log. About 3 s per fault.
#
#   bench/nemesis.sh [--out DIR] [--faults N] [--seed S] [--store file|etcd|both]
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/nemesis faults=200 seed=4242 store=both
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift ;;
    --faults) faults=${2:?--faults needs a number}; shift ;;
    --seed) seed=${2:?--seed needs a number}; shift ;;
    --store) store=${2:?--store needs file, etcd or both}; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "nemesis.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $faults in ''|*[!0-9]*) echo "nemesis.sh: --faults $faults: a whole number of faults, e.g. 200" >&2; exit 2 ;; esac
case $seed in ''|*[!0-9]*) echo "nemesis.sh: --seed $seed: a whole number, e.g. 4242" >&2; exit 2 ;; esac
case $store in
  file) filters=(nemesis_kills) ;;
  etcd) filters=(etcd::) ;;
  both) filters=(nemesis_kills etcd::) ;;
  *) echo "nemesis.sh: --store $store: file, etcd or both" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "nemesis.sh: needs root (the partitions are nftables rules)" >&2; exit 2; }
command -v nft >/dev/null || { echo "nemesis.sh: no nft: apt-get install nftables" >&2; exit 2; }
mkdir -p "$out"
cargo build -p trellis-cli --tests --quiet
for f in "${filters[@]}"; do
  name=file; [ "$f" = etcd:: ] && name=etcd
  echo "nemesis.sh: $name store, $faults faults, seed $seed"
  TRELLIS_NEMESIS_FAULTS=$faults TRELLIS_NEMESIS_SEED=$seed TRELLIS_REQUIRE_PARTITIONS=1 \
    TRELLIS_REQUIRE_ETCD=1 TRELLIS_NEMESIS_JSON="$out/nemesis-$name.json" \
    cargo test -p trellis-cli --test nemesis "$f" -- --nocapture >"$out/nemesis-$name.log" 2>&1 \
    || { tail -40 "$out/nemesis-$name.log"; echo "nemesis.sh: the $name run failed (log: $out/nemesis-$name.log)" >&2; exit 1; }
  grep -E '^nemesis report' "$out/nemesis-$name.log"
done
