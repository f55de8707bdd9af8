# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Shared helpers of the get_*.sh scripts (sourced, not run): argument parsing,
# mirror lookup, downloads, checksums and IDX header checks.

# Set by the sourcing script before parse_args: SCRIPT (its name), DATASET (data/<DATASET> default).
MIRROR_DIR="${MPX_DATA_MIRROR:-}"
MIRROR_FROM="MPX_DATA_MIRROR"
TARGET=""

say() { echo "$SCRIPT: $*"; }
die() {
  echo "$SCRIPT: error: $*" >&2
  exit 1
}

usage() {
  cat <<EOF
usage: $SCRIPT [--from DIR] [TARGET_DIR]

Fetches the official $DATASET files into TARGET_DIR (default: data/$DATASET,
relative to the current directory, which is where mpx looks by default) and
verifies them. Already present and verified: nothing to do, exit 0.

  --from DIR   copy from a local copy instead of downloading (same as
               MPX_DATA_MIRROR=DIR); DIR is either the data set folder itself
               or a folder holding it (as ../shared/data holds mnist/, cifar10-subset/)
EOF
}

parse_args() {
  while (($#)); do
    case "$1" in
      -h | --help)
        usage
        exit 0
        ;;
      --from)
        (($# >= 2)) || die "--from needs a directory"
        MIRROR_DIR="$2"
        MIRROR_FROM="--from"
        shift 2
        ;;
      --from=*)
        MIRROR_DIR="${1#--from=}"
        MIRROR_FROM="--from"
        shift
        ;;
      -*) die "unknown option $1 (see --help)" ;;
      *)
        [[ -z "$TARGET" ]] || die "more than one target directory given ($TARGET, $1)"
        TARGET="$1"
        shift
        ;;
    esac
  done
  TARGET="${TARGET:-data/$DATASET}"
  if [[ -n "$MIRROR_DIR" && ! -d "$MIRROR_DIR" ]]; then
    die "mirror directory $MIRROR_DIR (from $MIRROR_FROM) does not exist"
  fi
}

# sha256 of a file's content, decompressed when it is gzip.
content_sha256() {
  if [[ "$1" == *.gz ]]; then
    gzip -dc -- "$1" | sha256sum | cut -d' ' -f1
  else
    sha256sum -- "$1" | cut -d' ' -f1
  fi
}

# Decompressed bytes of a file (plain or .gz) to stdout.
content() {
  if [[ "$1" == *.gz ]]; then gzip -dc -- "$1"; else cat -- "$1"; fi
}

# install_file TMP NAME SUFFIX: moves a verified TMP to $TARGET/NAME[SUFFIX], replacing
# either form (raw or .gz) of NAME that was there.
install_file() {
  rm -f -- "$TARGET/$2" "$TARGET/$2.gz"
  mv -- "$1" "$TARGET/$2$3"
}

# The first existing of NAME, NAME.gz under DIR ("" when neither).
find_plain_or_gz() {
  local dir="$1" name="$2"
  if [[ -f "$dir/$name" ]]; then
    echo "$dir/$name"
  elif [[ -f "$dir/$name.gz" ]]; then
    echo "$dir/$name.gz"
  fi
}

# download URL OUT: curl or wget, a few retries; non-zero on failure.
download() {
  local url="$1" out="$2"
  say "downloading $url"
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 2 --connect-timeout 20 -o "$out" "$url"
  elif command -v wget >/dev/null 2>&1; then
    wget -q --tries=2 --timeout=20 -O "$out" "$url"
  else
    die "neither curl nor wget is installed (or copy the files with --from DIR / MPX_DATA_MIRROR)"
  fi
}

# The first N bytes of the decompressed content of FILE as decimal numbers, one line.
# (The reader stops early; gzip's SIGPIPE is not an error here.)
head_bytes() {
  { content "$1" 2>/dev/null || true; } | head -c "$2" | od -An -tu1 -v | tr -s ' \n' ' '
}

# check_idx FILE KIND(images|labels) COUNT: magic, count, 28x28, exact size. Prints why on failure.
check_idx() {
  local file="$1" kind="$2" count="$3" size expected hdr=() w=()
  read -r -a hdr <<<"$(head_bytes "$file" 16)"
  local i
  for ((i = 0; i + 3 < ${#hdr[@]}; i += 4)); do
    w+=($((hdr[i] * 16777216 + hdr[i + 1] * 65536 + hdr[i + 2] * 256 + hdr[i + 3])))
  done
  size=$({ content "$file" 2>/dev/null || true; } | wc -c)
  if [[ "$kind" == images ]]; then
    ((${#w[@]} == 4)) || { echo "too short for an IDX images header ($size bytes)"; return 1; }
    ((w[0] == 2051)) || { echo "bad magic ${w[0]} (expected 2051 = 0x00000803)"; return 1; }
    ((w[1] == count)) || { echo "header says ${w[1]} images, expected $count"; return 1; }
    ((w[2] == 28 && w[3] == 28)) || { echo "images are ${w[2]}x${w[3]}, expected 28x28"; return 1; }
    expected=$((16 + count * 784))
  else
    ((${#w[@]} >= 2)) || { echo "too short for an IDX labels header ($size bytes)"; return 1; }
    ((w[0] == 2049)) || { echo "bad magic ${w[0]} (expected 2049 = 0x00000801)"; return 1; }
    ((w[1] == count)) || { echo "header says ${w[1]} labels, expected $count"; return 1; }
    expected=$((8 + count))
  fi
  ((size == expected)) || { echo "holds $size bytes (decompressed), expected $expected"; return 1; }
}
