#!/bin/sh
# tests/make_fuzz_corpus.sh - writes a seed corpus for tests/fuzz_idx.c (or, with --spec, for
# tests/fuzz_spec.c).
#
#   sh tests/make_fuzz_corpus.sh fuzz-corpus
#   sh tests/make_fuzz_corpus.sh --spec spec-corpus
#
# Into the folder given as $1: small valid IDX files of every element type,
# raw and gzip-compressed; a two-member gzip file; raw deflate streams (one
# stored block, and the Huffman-coded stream cut out of a gzip file); and,
# when data/mnist (or the folder in $MNISTCU_DATA) has the MNIST training
# labels, a truncated copy of them. Needs only printf, od, head, wc and gzip.
set -eu

# --spec OUTPUT_DIR: seeds for tests/fuzz_spec.c instead (model spec strings).
if [ "${1:-}" = "--spec" ]; then
    out=${2:?"usage: $0 --spec OUTPUT_DIR"}
    mkdir -p "$out"
    n=0
    for spec in "lenet5" "fashion-cnn" "784-128-10" "784-256-128-10" \
        "1x28x28 conv3x3x32:p=1 batchnorm relu maxpool2 flatten dropout0.25 dense10" \
        "2x13x11 conv3x3x4:p=1 leaky_relu0.1 maxpool3:s=2 conv3x2x6:s=2:p=1:bias=0 batchnorm relu avgpool2:s=1 softmax flatten batchnorm:eps=0.001:momentum=0.25 dropout0.25 dense12 tanh dense8 sigmoid softmax dense5" \
        "784 dense10:bias=0" "1x5x5 conv7x7x2" "3x8x8 maxpool2x3:s=1 flatten dense3" "10 bogus dense2" \
        "1x28x28 conv5x5" "  1x12x12 conv3x3x4 relu flatten dense5  "; do
        printf '%s' "$spec" >"$out/spec$n"
        n=$((n + 1))
    done
    exit 0
fi

out=${1:?"usage: $0 OUTPUT_DIR"}
mkdir -p "$out"

# Bytes are written with printf octal escapes: \010 is 0x08 (ubyte), \011 0x09
# (byte), \013 0x0B (short), \014 0x0C (int), \015 0x0D (float), \016 0x0E (double).

# ubyte labels: 10 values 0..9
printf '\000\000\010\001\000\000\000\012\000\001\002\003\004\005\006\007\010\011' >"$out/labels-u8.idx"
# ubyte images: 2 x 3 x 3
printf '\000\000\010\003\000\000\000\002\000\000\000\003\000\000\000\003' >"$out/images-u8.idx"
printf '\000\377\200\001\002\003\177\200\201\000\000\000\377\377\377\001\001\001' >>"$out/images-u8.idx"
# byte: -128 -1 0 127
printf '\000\000\011\001\000\000\000\004\200\377\000\177' >"$out/values-i8.idx"
# short: -32768 -2 258
printf '\000\000\013\001\000\000\000\003\200\000\377\376\001\002' >"$out/values-i16.idx"
# int, 2 x 1: 1, -123456789
printf '\000\000\014\002\000\000\000\002\000\000\000\001\000\000\000\001\370\244\062\353' >"$out/values-i32.idx"
# float: -1.5 0.1 123.456
printf '\000\000\015\001\000\000\000\003\277\300\000\000\075\314\314\315\102\366\351\171' >"$out/values-f32.idx"
# double: -2.25 pi
printf '\000\000\016\001\000\000\000\002\300\002\000\000\000\000\000\000\100\011\041\373\124\104\055\030' \
    >"$out/values-f64.idx"
# an empty tensor: 0 x 28
printf '\000\000\010\002\000\000\000\000\000\000\000\034' >"$out/empty-u8.idx"

for f in "$out"/*.idx; do
    gzip -9 -n -c "$f" >"$f.gz"
done

# two gzip members: the decoder must concatenate them
cat "$out/labels-u8.idx.gz" "$out/values-i16.idx.gz" >"$out/two-members.gz"

# small decompression bombs, for the loader's early refusals: an IDX header for
# 10 x 10 x 10 bytes with more zeros than that (refused at the byte past the
# payload) and with exactly that many (loaded, sized by the header); a header
# claiming 2^31 x 28 x 28 (above the cap at once); and one for 60000 x 28 x 28
# whose few dozen bytes cannot expand to that (refused at once). Small outputs
# keep the fuzzer fast: the refusals do not depend on the sizes.
zeros() { head -c "$1" /dev/zero; }
{ printf '\000\000\010\003\000\000\000\012\000\000\000\012\000\000\000\012'; zeros 3000; } |
    gzip -9 -n >"$out/bomb-more-than-header.idx.gz"
{ printf '\000\000\010\003\000\000\000\012\000\000\000\012\000\000\000\012'; zeros 1000; } |
    gzip -9 -n >"$out/bomb-exact.idx.gz"
{ printf '\000\000\010\003\200\000\000\000\000\000\000\034\000\000\000\034'; zeros 1000; } |
    gzip -9 -n >"$out/bomb-header-too-large.idx.gz"
{ printf '\000\000\010\003\000\000\352\140\000\000\000\034\000\000\000\034'; zeros 1000; } |
    gzip -9 -n >"$out/bomb-cannot-hold.idx.gz"

# raw deflate: one final stored block holding "hello"
printf '\001\005\000\372\377hello' >"$out/stored.deflate"

# raw deflate: the stream inside a gzip file, without its 10-byte header and
# 8-byte trailer (gzip -n writes no optional header fields)
slice() { # slice FILE SKIP COUNT: COUNT bytes of FILE from offset SKIP, to stdout
    for byte in $(od -An -v -to1 -j "$2" -N "$3" "$1"); do
        printf "\\$byte"
    done
}
gz="$out/images-u8.idx.gz"
size=$(wc -c <"$gz")
slice "$gz" 10 $((size - 18)) >"$out/images-u8.deflate"

# the start of the real MNIST labels: a gzip file cut short, and a raw IDX
# file whose header promises 60000 labels but holds 1000
dir=${MNISTCU_DATA:-data/mnist}
labels="$dir/train-labels-idx1-ubyte.gz"
if [ -f "$labels" ]; then
    head -c 3000 "$labels" >"$out/train-labels-truncated.gz"
    gzip -dc "$labels" | head -c 1008 >"$out/train-labels-1000.idx"
    gzip -9 -n -c "$out/train-labels-1000.idx" >"$out/train-labels-1000.idx.gz"
else
    echo "$0: $labels not found: no MNIST seeds" >&2
fi

echo "$0: wrote $(ls "$out" | wc -l | tr -d ' ') files into $out"
