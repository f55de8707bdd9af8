#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fetches CIFAR-10, binary version (data_batch_1..5.bin, test_batch.bin,
# batches.meta.txt) into data/cifar10/ or the folder given. Sources: a local copy
# (--from DIR or MPX_DATA_MIRROR=DIR: DIR/cifar10/, DIR/cifar10-subset/,
# DIR/cifar-10-batches-bin/ or DIR, holding the .bin files or the official
# cifar-10-binary.tar.gz), else the official tarball from cs.toronto.edu,
# checked against its published MD5. Every .bin file is checked to be a whole
# number of 3073-byte records (the official files: exactly 10000 each), and
# against the mirror's SHA256SUMS where it has one. Idempotent.
set -euo pipefail
SCRIPT=get_cifar10.sh
DATASET=cifar10
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"

URL=https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz
TARBALL=cifar-10-binary.tar.gz
TARBALL_MD5=c32a1d4ab5d03f1284b67883e8d87530  # published on https://www.cs.toronto.edu/~kriz/cifar.html
RECORD=3073
BATCHES=(data_batch_1.bin data_batch_2.bin data_batch_3.bin data_batch_4.bin data_batch_5.bin)

# check_bin FILE: a non-empty whole number of records; prints why not.
check_bin() {
  local size
  size=$(stat -c %s -- "$1")
  ((size > 0)) || { echo "empty file"; return 1; }
  ((size % RECORD == 0)) || { echo "$size bytes is not a whole number of $RECORD-byte records (partial record at byte offset $((size / RECORD * RECORD)))"; return 1; }
}

records() { echo $(($(stat -c %s -- "$1") / RECORD)); }

# The SHA-256 a mirror's SHA256SUMS lists for DIR/NAME ("" when none): DIR/SHA256SUMS
# ("NAME") or DIR/../SHA256SUMS ("basename(DIR)/NAME"), as ../shared/data has it.
listed_sha() {
  local dir="$1" name="$2" sums
  for sums in "$dir/SHA256SUMS:$name" "$(dirname -- "$dir")/SHA256SUMS:$(basename -- "$dir")/$name"; do
    local file="${sums%%:*}" key="${sums#*:}"
    if [[ -f "$file" ]]; then
      awk -v k="$key" '$2 == k || $2 == "*" k { print $1; exit }' "$file"
    fi
  done | head -n 1
}

# Summary of what TARGET holds, when it is a valid copy; non-zero (and why) otherwise.
present() {
  [[ -f "$TARGET/data_batch_1.bin" ]] || { echo "no data_batch_1.bin"; return 1; }
  [[ -f "$TARGET/test_batch.bin" ]] || { echo "no test_batch.bin"; return 1; }
  local f n=0 k=0 why
  for f in "${BATCHES[@]}" test_batch.bin; do
    [[ -f "$TARGET/$f" ]] || continue
    why=$(check_bin "$TARGET/$f") || { echo "$TARGET/$f: $why"; return 1; }
    if [[ "$f" != test_batch.bin ]]; then n=$((n + $(records "$TARGET/$f"))); k=$((k + 1)); fi
  done
  echo "$n training records in $k of 5 batch files, $(records "$TARGET/test_batch.bin") test records"
}

if summary=$(present); then
  say "CIFAR-10 already present and verified in $TARGET ($summary)"
  exit 0
elif [[ -d "$TARGET" && -n "$(ls -A -- "$TARGET" 2>/dev/null)" ]]; then
  say "$TARGET holds no valid copy ($summary); fetching it again"
fi

mkdir -p -- "$TARGET" || die "cannot create $TARGET"
work=$(mktemp -d "$TARGET/.part-XXXXXX") || die "cannot create a temporary folder in $TARGET"
trap 'rm -rf -- "$work"' EXIT

# Unpacks the official tarball into $work/bin after checking its MD5.
unpack_tarball() {
  local tgz="$1" md5
  md5=$(md5sum <"$tgz" | cut -d' ' -f1)
  [[ "$md5" == "$TARBALL_MD5" ]] || die "$2 has MD5 $md5, expected the official $TARBALL_MD5 (corrupt or incomplete download?)"
  mkdir -p "$work/bin"
  tar -xzf "$tgz" -C "$work/bin" --strip-components=1 --wildcards '*.bin' '*batches.meta.txt' ||
    die "cannot unpack $2"
  local f
  for f in "${BATCHES[@]}" test_batch.bin; do
    [[ -f "$work/bin/$f" ]] || die "$2 holds no $f"
    [[ "$(stat -c %s -- "$work/bin/$f")" == 30730000 ]] || die "$2: $f is not 10000 records of $RECORD bytes"
  done
}

bin_src=""
origin=""
if [[ -n "$MIRROR_DIR" ]]; then
  for d in "$MIRROR_DIR/cifar10" "$MIRROR_DIR/cifar10-subset" "$MIRROR_DIR/cifar-10-batches-bin" "$MIRROR_DIR"; do
    if [[ -f "$d/data_batch_1.bin" ]]; then
      bin_src="$d"
      origin="$d"
      break
    fi
    if [[ -f "$d/$TARBALL" ]]; then
      say "unpacking $d/$TARBALL"
      unpack_tarball "$d/$TARBALL" "$d/$TARBALL"
      bin_src="$work/bin"
      origin="$d/$TARBALL"
      break
    fi
  done
  [[ -n "$bin_src" ]] || die "no CIFAR-10 files (data_batch_1.bin or $TARBALL) in $MIRROR_DIR/cifar10, $MIRROR_DIR/cifar10-subset, $MIRROR_DIR/cifar-10-batches-bin or $MIRROR_DIR"
else
  download "$URL" "$work/$TARBALL" ||
    die "could not download $URL (offline? copy the files with --from DIR or MPX_DATA_MIRROR=DIR)"
  unpack_tarball "$work/$TARBALL" "$URL"
  rm -f -- "$work/$TARBALL"
  bin_src="$work/bin"
  origin="$URL"
fi

[[ -f "$bin_src/test_batch.bin" ]] || die "$bin_src has data_batch_1.bin but no test_batch.bin"
files=()
for f in "${BATCHES[@]}" test_batch.bin batches.meta.txt; do
  [[ -f "$bin_src/$f" ]] || continue
  if [[ "$f" == *.bin ]]; then
    why=$(check_bin "$bin_src/$f") || die "$bin_src/$f: $why"
  fi
  if [[ "$bin_src" != "$work/bin" ]]; then
    { cp -L -- "$bin_src/$f" "$work/$f" && chmod 644 -- "$work/$f"; } || die "cannot copy $bin_src/$f to $TARGET"
    want=$(listed_sha "$bin_src" "$f")
    if [[ -n "$want" ]]; then
      got=$(sha256sum <"$work/$f" | cut -d' ' -f1)
      [[ "$got" == "$want" ]] || die "$bin_src/$f has SHA-256 $got, but the mirror's SHA256SUMS lists $want"
    fi
  else
    mv -- "$work/bin/$f" "$work/$f"
  fi
  files+=("$f")
done
# Replace the old copy only now that the new one is complete and checked.
for f in "${BATCHES[@]}" test_batch.bin batches.meta.txt; do rm -f -- "$TARGET/$f"; done
for f in "${files[@]}"; do mv -- "$work/$f" "$TARGET/$f"; done
summary=$(present) || die "$TARGET: $summary"
say "CIFAR-10 ready in $TARGET from $origin ($summary)"
