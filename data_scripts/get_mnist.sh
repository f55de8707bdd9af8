#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fetches MNIST (the four official IDX files, gzipped) into data/mnist/ or the
# folder given, from the official mirrors or a local copy (--from DIR or
# MPX_DATA_MIRROR=DIR, looking in DIR/mnist/ then DIR), and verifies the SHA-256
# of every decompressed file. Idempotent.
set -euo pipefail
SCRIPT=get_mnist.sh
DATASET=mnist
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"

# SHA-256 of the decompressed official files.
declare -A SHA=(
  [train-images-idx3-ubyte]=ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
  [train-labels-idx1-ubyte]=65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
  [t10k-images-idx3-ubyte]=0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
  [t10k-labels-idx1-ubyte]=ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2
)
NAMES=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
URLS=(https://ossci-datasets.s3.amazonaws.com/mnist https://storage.googleapis.com/cvdf-datasets/mnist)

verified() {  # verified FILE NAME
  [[ -n "$1" && -f "$1" ]] && [[ "$(content_sha256 "$1")" == "${SHA[$2]}" ]]
}

# Install a verified temporary file as NAME(.gz), replacing any other copy.
todo=()
for name in "${NAMES[@]}"; do
  have=$(find_plain_or_gz "$TARGET" "$name")
  if verified "$have" "$name"; then continue; fi
  [[ -n "$have" ]] && say "$have does not match the official checksum; fetching it again"
  todo+=("$name")
done
if ((${#todo[@]} == 0)); then
  say "MNIST already present and verified in $TARGET"
  exit 0
fi

mkdir -p -- "$TARGET" || die "cannot create $TARGET"
src=""
if [[ -n "$MIRROR_DIR" ]]; then
  for d in "$MIRROR_DIR/mnist" "$MIRROR_DIR"; do
    if [[ -n "$(find_plain_or_gz "$d" train-images-idx3-ubyte)" ]]; then src="$d"; break; fi
  done
  [[ -n "$src" ]] || die "no MNIST files (train-images-idx3-ubyte[.gz], ...) in $MIRROR_DIR/mnist or $MIRROR_DIR"
fi

for name in "${todo[@]}"; do
  if [[ -n "$src" ]]; then
    from=$(find_plain_or_gz "$src" "$name")
    [[ -n "$from" ]] || die "$src/$name(.gz) not found in the mirror"
    suffix=""; [[ "$from" == *.gz ]] && suffix=.gz
    tmp="$TARGET/.part-$name$suffix"
    { cp -- "$from" "$tmp" && chmod 644 -- "$tmp"; } || die "cannot copy $from to $TARGET"
    if ! verified "$tmp" "$name"; then
      rm -f -- "$tmp"
      die "$from does not match the official SHA-256 of $name (${SHA[$name]}); the mirror copy is corrupt"
    fi
    install_file "$tmp" "$name" "$suffix"
    say "copied $from"
  else
    tmp="$TARGET/.part-$name.gz"
    ok=0
    for base in "${URLS[@]}"; do
      if download "$base/$name.gz" "$tmp"; then
        if verified "$tmp" "$name"; then ok=1; break; fi
        say "$base/$name.gz does not match the official SHA-256; trying the next mirror"
      fi
    done
    if ((ok == 0)); then
      rm -f -- "$tmp"
      die "could not fetch a verified $name.gz from ${URLS[*]} (offline? copy it with --from DIR or MPX_DATA_MIRROR=DIR)"
    fi
    install_file "$tmp" "$name" .gz
  fi
done
say "MNIST ready in $TARGET (SHA-256 of all four files verified)"
