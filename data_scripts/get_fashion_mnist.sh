#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fetches Fashion-MNIST (four gzipped IDX files, the MNIST format) into
# data/fashion_mnist/ or the folder given. Sources, in order: a local copy
# (--from DIR or MPX_DATA_MIRROR=DIR: DIR/fashion_mnist/, DIR/fashion-mnist/ or
# DIR), the Debian/Ubuntu package dataset-fashion-mnist
# (/usr/share/datasets/fashion-mnist/), the official host. Downloads are checked
# against the official MD5 of each .gz; every file is checked for its IDX header,
# record count, 28x28 size and exact length. Idempotent.
set -euo pipefail
SCRIPT=get_fashion_mnist.sh
DATASET=fashion_mnist
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"

NAMES=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
declare -A KIND=([train-images-idx3-ubyte]=images [train-labels-idx1-ubyte]=labels
                 [t10k-images-idx3-ubyte]=images [t10k-labels-idx1-ubyte]=labels)
declare -A COUNT=([train-images-idx3-ubyte]=60000 [train-labels-idx1-ubyte]=60000
                  [t10k-images-idx3-ubyte]=10000 [t10k-labels-idx1-ubyte]=10000)
# MD5 of the official .gz files (github.com/zalandoresearch/fashion-mnist).
declare -A MD5=(
  [train-images-idx3-ubyte]=8d4fb7e6c68d591d4c3dfef9ec88bf0d
  [train-labels-idx1-ubyte]=25c81989df183df01b3e8a0aad5dffbe
  [t10k-images-idx3-ubyte]=bef4ecab320f06d8554ea6380940ec79
  [t10k-labels-idx1-ubyte]=bb300cfdad3c16e7a12a480ee83cd310
)
URL=http://fashion-mnist.s3-website.eu-central-1.amazonaws.com
DEBIAN_DIR=/usr/share/datasets/fashion-mnist

# SHA-256 of the decompressed MNIST files: same format and sizes, a classic mix-up.
declare -A MNIST_SHA=(
  [train-images-idx3-ubyte]=ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
  [train-labels-idx1-ubyte]=65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
  [t10k-images-idx3-ubyte]=0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
  [t10k-labels-idx1-ubyte]=ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2
)

verified() {  # verified FILE NAME: prints why not
  [[ -n "$1" && -f "$1" ]] || return 1
  check_idx "$1" "${KIND[$2]}" "${COUNT[$2]}" || return 1
  if [[ "$(content_sha256 "$1")" == "${MNIST_SHA[$2]}" ]]; then
    echo "it is the MNIST $2, not Fashion-MNIST"
    return 1
  fi
}

todo=()
for name in "${NAMES[@]}"; do
  have=$(find_plain_or_gz "$TARGET" "$name")
  if [[ -n "$have" ]]; then
    if why=$(verified "$have" "$name"); then continue; fi
    say "$have is not a valid Fashion-MNIST file ($why); fetching it again"
  fi
  todo+=("$name")
done
if ((${#todo[@]} == 0)); then
  say "Fashion-MNIST already present and verified in $TARGET"
  exit 0
fi

mkdir -p -- "$TARGET" || die "cannot create $TARGET"
src=""
if [[ -n "$MIRROR_DIR" ]]; then
  for d in "$MIRROR_DIR/fashion_mnist" "$MIRROR_DIR/fashion-mnist" "$MIRROR_DIR"; do
    if [[ -n "$(find_plain_or_gz "$d" train-images-idx3-ubyte)" ]]; then src="$d"; break; fi
  done
fi
if [[ -z "$src" && -n "$(find_plain_or_gz "$DEBIAN_DIR" train-images-idx3-ubyte)" ]]; then
  src="$DEBIAN_DIR"
  say "using the Debian package dataset-fashion-mnist in $DEBIAN_DIR"
fi
if [[ -z "$src" && -n "$MIRROR_DIR" ]]; then
  die "no Fashion-MNIST files (train-images-idx3-ubyte[.gz], ...) in $MIRROR_DIR/fashion_mnist, $MIRROR_DIR/fashion-mnist, $MIRROR_DIR or $DEBIAN_DIR (apt-get install dataset-fashion-mnist provides them)"
fi

for name in "${todo[@]}"; do
  if [[ -n "$src" ]]; then
    from=$(find_plain_or_gz "$src" "$name")
    [[ -n "$from" ]] || die "$src/$name(.gz) not found"
    suffix=""; [[ "$from" == *.gz ]] && suffix=.gz
    tmp="$TARGET/.part-$name$suffix"
    { cp -L -- "$from" "$tmp" && chmod 644 -- "$tmp"; } || die "cannot copy $from to $TARGET"
    if ! why=$(verified "$tmp" "$name"); then
      rm -f -- "$tmp"
      die "$from is not a valid Fashion-MNIST $name: $why"
    fi
    note=""
    [[ "$suffix" == .gz && "$(md5sum <"$tmp" | cut -d' ' -f1)" == "${MD5[$name]}" ]] && note=" (official MD5)"
    install_file "$tmp" "$name" "$suffix"
    say "copied $from$note"
  else
    tmp="$TARGET/.part-$name.gz"
    if ! download "$URL/$name.gz" "$tmp"; then
      rm -f -- "$tmp"
      die "could not download $URL/$name.gz (offline? install the package dataset-fashion-mnist, or copy the files with --from DIR or MPX_DATA_MIRROR=DIR)"
    fi
    md5=$(md5sum <"$tmp" | cut -d' ' -f1)
    if [[ "$md5" != "${MD5[$name]}" ]]; then
      rm -f -- "$tmp"
      die "$URL/$name.gz has MD5 $md5, expected the official ${MD5[$name]}"
    fi
    if ! why=$(verified "$tmp" "$name"); then
      rm -f -- "$tmp"
      die "$URL/$name.gz is not a valid IDX file: $why"
    fi
    install_file "$tmp" "$name" .gz
  fi
done
say "Fashion-MNIST ready in $TARGET (headers, counts and sizes of all four files verified)"
