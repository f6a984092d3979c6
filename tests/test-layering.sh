#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The map of docs/design.md section 9, enforced (issue 32 item 1):
#   - every #include "..." of every part's files names a header of a
#     folder that part may use (the "may use" table below, which is
#     section 9's), and of the engine, the checkpoints and the control
#     server only their public headers;
#   - each part's library is compiled with only the include directories
#     it may use (its _CPPFLAGS in Makefile.am): a probe that includes a
#     forbidden header with those flags does not compile, and one that
#     includes an allowed header does (so the probe itself works).
set -euo pipefail
source "$(dirname "$0")/functions.sh"

cd "$top_srcdir"

# FOLDER -> what it may use: folders, or FOLDER:HEADER,... for only those
# headers of a folder (a part's public interface).  Its own folder is
# always allowed.  A row for one FILE narrows its folder's row for it.
declare -A may_use=(
    [common]=""
    [src/device]="common"
    [src/store]="common src/device"
    [src/catalogue]="common src/device src/store"
    [src/checkpoint]="common src/device src/store src/catalogue src/engine:engine.h,engine-checkpoint.h,stats.h"
    [src/engine]="common src/device src/store src/catalogue src/checkpoint:checkpoint.h,cbt-bitmap.h src/writeback:writeback.h"
    [src/writeback]="common src/device:device.h src/engine:engine.h,engine-internal.h,copy-out.h"
    [src/writeback/held-queue.c]="common"
    [src/writeback/held-queue.h]="common"
    [src/writeback/held-record.c]="common"
    [src/writeback/held-record.h]="common"
    [src/writeback/held-file.c]="common src/device:file-owner.h"
    [src/writeback/held-file.h]="common"
    [src/control]="common src/device src/store:store-types.h src/engine:engine.h,stats.h src/checkpoint:checkpoint.h"
    [src/repo]="common"
    [plugins/snapfg]="common src/device src/store:store-types.h,chunk-size.h src/catalogue:catalogue.h src/checkpoint:checkpoint.h src/engine:engine.h src/control:control-server.h"
    [plugins/snapfg-repo]="common src/repo:repo.h"
    [tools/common]="common src/control:control-commands.h,control-commands.def,control-protocol.h"
    [tools/snapfgctl]="common tools/common src/control:control-commands.h,control-commands.def,control-protocol.h src/store:dm-format.h,store-binding.h src/device:device.h src/engine:exception-table.h"
    [tools/snapfg-backup]="common tools/common src/control:control-commands.h,control-commands.def,control-protocol.h src/repo"
)

# Which folder holds each header (names are unique across the tree).
declare -A home=()
for d in "${!may_use[@]}"; do
    [ -d "$d" ] || continue
    for f in "$d"/*.h "$d"/*.def; do
        [ -e "$f" ] || continue
        h=${f##*/}
        if [ -n "${home[$h]:-}" ] && [ "${home[$h]}" != "$d" ]; then
            check_fail "$h is in both ${home[$h]} and $d: an include cannot say which"
        fi
        home[$h]=$d
    done
done

# Every folder with C sources is in the table.
for f in $(find common src plugins tools -name '*.[ch]' | sort); do
    d=${f%/*}
    [ -n "${may_use[$d]+x}" ] || check_fail "$d ($f) is not in this test's table: add its row here and in docs/design.md section 9"
done

# allowed FROM HEADER: may FROM (a folder, or a file with its own row)
# include HEADER?
allowed() {
    local from=$1 h=$2 where=${home[$2]:-} entry dir list
    [ -n "$where" ] || return 2
    [ "$where" = "${from%/*.[ch]}" ] && return 0
    for entry in ${may_use[$from]}; do
        dir=${entry%%:*}
        [ "$dir" = "$where" ] || continue
        [ "$entry" = "$dir" ] && return 0
        list=,${entry#*:},
        case $list in *",$h,"*) return 0 ;; esac
    done
    return 1
}

checked=0
# One grep for every file: FILE:HEADER lines.
folders=()
for d in "${!may_use[@]}"; do [ -d "$d" ] && folders+=("$d"); done
while IFS= read -r line; do
    f=${line%%:*}
    h=${line#*:}
    d=${f%/*}
    [ -z "${may_use[$f]+x}" ] || d=$f
    checked=$((checked + 1))
    st=0
    allowed "$d" "$h" || st=$?
    case $st in
        0) ;;
        2) check_fail "$f includes \"$h\", which is in no folder of the tree" ;;
        *) check_fail "$f includes \"$h\" of ${home[$h]}, which $d may not use (docs/design.md section 9)" ;;
    esac
done < <(for d in "${folders[@]}"; do
             ls "$d"/*.c "$d"/*.h "$d"/*.def 2>/dev/null || true
         done | xargs grep -H -o '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*"' |
             sed 's/:[^"]*"\([^"]*\)"$/:\1/')
[ "$checked" -gt 200 ] || check_fail "only $checked includes found: the scan itself is broken"
info "ok: $checked includes checked against the table"

# The same rule broken on purpose must be caught: the table refuses the
# catalogue including the engine's header, a checkpoint file the
# engine's internals, the store an engine header.
allowed src/catalogue engine.h && check_fail "the table lets the catalogue include engine.h"
allowed src/checkpoint engine-internal.h && check_fail "the table lets the checkpoints include engine-internal.h"
allowed src/store exception-table.h && check_fail "the table lets the stores include exception-table.h"
allowed src/control engine-internal.h && check_fail "the table lets the control server include engine-internal.h"
allowed src/writeback/held-queue.c engine-internal.h && check_fail "the table lets the held-write queue include engine-internal.h"
allowed src/writeback/held-queue.c held-queue.h || check_fail "the table keeps the held-write queue from its own header"
allowed src/writeback/held-record.c engine.h && check_fail "the table lets the held file's layout include engine.h"
allowed src/repo engine.h && check_fail "the table lets the repository include engine.h"
allowed plugins/snapfg-repo repo-private.h && check_fail "the table lets the snapfg-repo plugin include repo-private.h"

# --- the build: each library's own include path ---

# cppflags VAR: VAR's value in Makefile.am, continuation lines joined,
# $(top_srcdir) made a path, a value that is one other variable
# ($(ENGINE_CPPFLAGS)) replaced by that one's.
cppflags() {
    local v
    v=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' Makefile.am |
        sed -n "s/^$1[[:space:]]*=[[:space:]]*//p")
    [ -n "$v" ] || { check_fail "Makefile.am has no $1"; return 1; }
    if [[ $v =~ ^\$\(([A-Z_]+)\)$ ]]; then
        cppflags "${BASH_REMATCH[1]}"
        return
    fi
    echo "${v//\$(top_srcdir)/$top_srcdir}"
}

cc=${CC:-cc}
command -v "$cc" >/dev/null || skip "no C compiler ($cc)"
probe="$tmpdir/probe.c"

# compiles LIBRARY-CPPFLAGS-VAR HEADER: does a file including HEADER
# compile with that library's include path?
compiles() {
    local flags
    flags=$(cppflags "$1") || return 2
    printf '#include "%s"\nint probe_ (void);\n' "$2" >"$probe"
    # shellcheck disable=SC2086
    "$cc" -std=gnu11 -D_GNU_SOURCE -fsyntax-only -I"${top_builddir:-.}" $flags \
        $(pkg-config --cflags jansson libnbd 2>/dev/null) "$probe" >"$tmpdir/probe.err" 2>&1
}

# must_refuse VAR HEADER / must_build VAR HEADER
must_refuse() {
    if compiles "$1" "$2"; then
        check_fail "$1 lets a file include \"$2\": the library's include path allows more than its part may use"
    else
        grep -q "$2" "$tmpdir/probe.err" ||
            { cat "$tmpdir/probe.err" >&2; check_fail "$1 + \"$2\": failed, but not for the include"; }
        info "ok: $1: \"$2\" does not build"
    fi
}
must_build() {
    compiles "$1" "$2" ||
        { cat "$tmpdir/probe.err" >&2; check_fail "$1: \"$2\" (allowed) does not build: the probe is broken"; }
}

must_build common_libsnapfg_common_la_CPPFLAGS vector.h
must_refuse common_libsnapfg_common_la_CPPFLAGS device.h
must_build src_device_libsnapfg_device_la_CPPFLAGS device.h
must_refuse src_device_libsnapfg_device_la_CPPFLAGS store.h
must_build src_store_libsnapfg_store_la_CPPFLAGS store.h
must_refuse src_store_libsnapfg_store_la_CPPFLAGS exception-table.h
must_refuse src_store_libsnapfg_store_la_CPPFLAGS catalogue.h
must_build src_store_libsnapfg_format_la_CPPFLAGS dm-format.h
must_refuse src_store_libsnapfg_format_la_CPPFLAGS engine.h
must_build src_catalogue_libsnapfg_catalogue_la_CPPFLAGS catalogue.h
must_refuse src_catalogue_libsnapfg_catalogue_la_CPPFLAGS engine.h
must_refuse src_catalogue_libsnapfg_catalogue_la_CPPFLAGS engine-internal.h
must_refuse src_catalogue_libsnapfg_catalogue_la_CPPFLAGS checkpoint.h
must_build src_checkpoint_libsnapfg_checkpoint_la_CPPFLAGS checkpoint.h
must_refuse src_checkpoint_libsnapfg_checkpoint_la_CPPFLAGS control-protocol.h
must_build src_control_libsnapfg_protocol_la_CPPFLAGS control-protocol.h
must_refuse src_control_libsnapfg_protocol_la_CPPFLAGS engine.h
must_build src_control_libsnapfg_control_la_CPPFLAGS control-handlers.h
# (The control server's path holds what engine.h includes, so only the
# table above keeps it from the catalogue's or the engine's internals.)
must_refuse src_control_libsnapfg_control_la_CPPFLAGS tool-output.h
must_build src_engine_libsnapfg_engine_la_CPPFLAGS engine-internal.h
must_refuse src_engine_libsnapfg_engine_la_CPPFLAGS control-protocol.h
must_refuse src_engine_libsnapfg_engine_la_CPPFLAGS repo.h
must_build src_writeback_libsnapfg_writeback_la_CPPFLAGS writeback-internal.h
must_refuse src_writeback_libsnapfg_writeback_la_CPPFLAGS control-server.h
must_build src_repo_libsnapfg_repo_la_CPPFLAGS repo-admin.h
must_refuse src_repo_libsnapfg_repo_la_CPPFLAGS engine.h
must_refuse src_repo_libsnapfg_repo_la_CPPFLAGS device.h
must_build src_repo_libsnapfg_repo_s3_la_CPPFLAGS repo-s3-config.h
must_build plugins_snapfg_repo_nbdkit_snapfg_repo_plugin_la_CPPFLAGS repo.h
must_refuse plugins_snapfg_repo_nbdkit_snapfg_repo_plugin_la_CPPFLAGS engine.h
must_refuse src_repo_libsnapfg_repo_s3_la_CPPFLAGS store.h
finish
