#!/usr/bin/env bash
# Compile time and peak memory against the number of tensors (targets: near
# linear; a 10^6-tensor model within a minute and 4 GiB). The model is N
# tensors of [64, 32]; training holds them at TP2, inference at TP1, on the
# bundled DGX H100 cluster. Prints N, wall seconds, peak RSS and plan size per
# size, the median of REPS runs each.
#   tools/bench/many_tensors_bench.sh [REPS] [N ...]   (default: 3 10000 100000 1000000)
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-3}
shift || true
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(10000 100000 1000000)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j2 reshard >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
printf "%10s %10s %12s %12s\n" tensors wall_s peak_MiB plan_MiB
for n in "${SIZES[@]}"; do
  python3 - "$n" "$TMP" <<'PY'
import json, sys
n, out = int(sys.argv[1]), sys.argv[2]
json.dump({"format": "reshard.model/1", "name": "many", "dtype": "bf16",
           "tensors": [{"name": f"t{i}.weight", "shape": [64, 32]} for i in range(n)]}, open(f"{out}/model.json", "w"))
for name, ranks, place in (("train", 2, {"match": "*", "tp": {"shard": 0}}), ("infer", 1, {"match": "*"})):
    json.dump({"format": "reshard.layout/1", "name": name, "model": "many", "ranks": ranks,
               "meshes": {"m": [["tp", ranks]]}, "placements": [place]}, open(f"{out}/{name}.json", "w"))
PY
  walls=() rss=()
  for _ in $(seq "$REPS"); do
    /usr/bin/time -f "%e %M" -o "$TMP/time" build/reshard compile -q --model "$TMP/model.json" --from "$TMP/train.json" \
      --to "$TMP/infer.json" --cluster samples/clusters/dgx-h100.json -o "$TMP/p.rsplan"
    read -r w m <"$TMP/time"
    walls+=("$w") rss+=("$m")
  done
  med() { printf "%s\n" "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
  awk -v n="$n" -v w="$(med "${walls[@]}")" -v m="$(med "${rss[@]}")" -v p="$(stat -c %s "$TMP/p.rsplan")" \
    'BEGIN { printf "%10d %10.2f %12.0f %12.1f\n", n, w, m / 1024, p / 1048576 }'
done
