#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfgctl as a user meets it, against a real nbdkit:
#
#  1. --version ("snapfgctl VERSION", the configured version), help,
#     help COMMAND and COMMAND --help; snapfgctl help and the man page
#     (man/snapfgctl.pod, COMMANDS) list the same commands, README has a
#     row for each in its command tables, and every
#     command of the help has its own --help;
#  2. options anywhere on the line: --json before or after the command
#     or its arguments, -S after the command, --socket=, "--";
#  3. exit statuses: 0 done, 1 refused by the server, 2 usage error
#     (unknown command, missing or extra argument, an option of another
#     command, a bad size), 4 server unreachable (no socket, a server
#     that closes without replying, a reply that is not JSON);
#  4. one line on success for create, drop, set-block-size and merge;
#  5. sizes with nbdkit's suffixes (b, s, k, m, g, t, p, e, either case)
#     give the COW size asked for; forms nbdkit refuses are refused;
#  6. status --json: numeric allocated_bytes, total_bytes, metadata_bytes
#     and percent, consistent with the dm status string;
#  7. --json inspect prints one JSON object matching the human form;
#  8. stats --prometheus parsed by a strict parser of the text format
#     (HELP and TYPE before the samples, names snapfg_*, counters
#     *_total, label escapes, no duplicate series), values equal to
#     stats --json, a snapshot name with a quote and a backslash round
#     trips through the label escaping; promtool check metrics too if
#     installed;
#  9. merge --wait: returns when the merge is done (the snapshot gone,
#     the origin back to the snapshot's contents), with a progress line
#     on a terminal (run under script(1)).
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

size=$((8 * 1024 * 1024))
test_files "$size"
# The merge is slowed down so that merge --wait has something to show.
SNAPFG_TEST_MERGE_DELAY_US=2000 start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock"

# run_st ARGS...: snapfgctl ARGS (no -S added); prints the exit status.
run_st() {
    local st=0
    timeout 60 "$SNAPFGCTL" "$@" >"$tmpdir/run.out" 2>"$tmpdir/run.err" || st=$?
    echo "$st"
}
expect_st() {  # WHAT WANT ARGS...
    local what=$1 want=$2 got
    shift 2
    got=$(run_st "$@")
    if [ "$got" = "$want" ]; then
        info "ok: $what: exit $got${3:+ }$(head -n1 "$tmpdir/run.err")"
    else
        cat "$tmpdir/run.out" "$tmpdir/run.err" >&2
        check_fail "$what: snapfgctl $* exited $got, expected $want"
    fi
}

# =====================================================================
info "=== 1. --version and help"
version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"$/\1/p' "$top_builddir/config.h")
[ -n "$version" ] || fail "no PACKAGE_VERSION in $top_builddir/config.h"
expect_st "--version" 0 --version
[ "$(cat "$tmpdir/run.out")" = "snapfgctl $version" ] && info "ok: --version prints 'snapfgctl $version'" ||
    check_fail "--version printed '$(cat "$tmpdir/run.out")', expected 'snapfgctl $version'"
expect_st "help" 0 help
cp "$tmpdir/run.out" "$tmpdir/help.txt"
expect_st "--help" 0 --help
cmp -s "$tmpdir/run.out" "$tmpdir/help.txt" || check_fail "--help and help print different texts"
# The commands of the help: the lines "  NAME  summary" (NAME in a
# column of 20, maybe two words) under the "Commands ..." and "Other
# commands:" headings.
help_cmds=$(awk '/^Commands|^Other commands/ { on = 1; next } /^$/ { on = 0 }
                 on && /^  [a-z]/ { n = substr($0, 3, 20); sub(/ +$/, "", n); print n }' \
    "$tmpdir/help.txt" | sort)
pod_cmds=$(awk '/^=head1 COMMANDS/ { on = 1; next } /^=head1/ { on = 0 } on && /^=item B</ { sub(/^=item B</, ""); sub(/>.*/, ""); print }' \
    "$top_srcdir/man/snapfgctl.pod" | sort)
[ -n "$help_cmds" ] || fail "no commands found in snapfgctl help"
if [ "$help_cmds" = "$pod_cmds" ]; then
    info "ok: snapfgctl help and snapfgctl(1) list the same commands: $(tr '\n' ',' <<<"$help_cmds")"
else
    diff <(echo "$help_cmds") <(echo "$pod_cmds") >&2 || true
    check_fail "snapfgctl help (<) and the man page's COMMANDS (>) differ"
fi
# README's command tables have a row for every command too.
readme_missing=
while read -r c; do
    grep -qE -- "^\|( \`[^|]*\`,)* \`$c[\` ]" "$top_srcdir/README.md" || readme_missing="$readme_missing $c"
done <<<"$help_cmds"
[ -z "$readme_missing" ] && info "ok: README's command tables have a row for every command" ||
    check_fail "README's command tables lack a row for:$readme_missing"
while read -r c; do
    # shellcheck disable=SC2086
    expect_st "$c --help" 0 $c --help
    grep -q "^usage: snapfgctl .*$c" "$tmpdir/run.out" || check_fail "$c --help: no usage line: $(head -n1 "$tmpdir/run.out")"
    cp "$tmpdir/run.out" "$tmpdir/c-help.txt"
    # shellcheck disable=SC2086
    expect_st "help $c" 0 help $c
    cmp -s "$tmpdir/run.out" "$tmpdir/c-help.txt" || check_fail "help $c and $c --help differ"
done <<<"$help_cmds"
expect_st "create --help names --cow" 0 create --help
grep -q -- "--cow PATH" "$tmpdir/run.out" && grep -q -- "--chunk-size SIZE" "$tmpdir/run.out" ||
    check_fail "create --help lacks --cow PATH / --chunk-size SIZE: $(cat "$tmpdir/run.out")"
expect_st "help of an unknown command" 2 help frobnicate

# =====================================================================
info "=== 2. options anywhere"
for args in "-S $ctlsock --json status" "-S $ctlsock status --json" "status --json -S $ctlsock" \
            "--socket=$ctlsock status --json" "status -S $ctlsock --json" "--json --socket $ctlsock list"; do
    # shellcheck disable=SC2086
    st=$(run_st $args)
    if [ "$st" = 0 ] && "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["ok"] and "origin" in d else 1)' "$tmpdir/run.out"; then
        info "ok: snapfgctl $args: JSON"
    else
        check_fail "snapfgctl $args: exit $st, output $(head -c 200 "$tmpdir/run.out")"
    fi
done
ctl_ok "create snap1 with the name after the options" "$ctlsock" create --cow "$tmpdir/snap1.cow" snap1 --store transient
for args in "changed snap1 --json" "--json changed snap1" "changed --json snap1" "status snap1 --json"; do
    # shellcheck disable=SC2086
    st=$(run_st -S "$ctlsock" $args)
    if [ "$st" = 0 ] && "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["ok"] else 1)' "$tmpdir/run.out"; then
        info "ok: snapfgctl $args: JSON"
    else
        check_fail "snapfgctl $args: exit $st, output $(head -c 200 "$tmpdir/run.out") $(head -c 200 "$tmpdir/run.err")"
    fi
done
# "--" ends the options: a name that starts with a dash.
ctl_ok "create -- -dash" "$ctlsock" create --cow "$tmpdir/dash.cow" --store transient -- -dash
listed "$sock" -dash && info "ok: the snapshot -dash exists" || check_fail "-dash is not listed"
ctl_ok "drop -- -dash" "$ctlsock" drop -- -dash

# =====================================================================
info "=== 3. exit statuses"
expect_st "done" 0 -S "$ctlsock" status
expect_st "refused: drop of an unknown snapshot" 1 -S "$ctlsock" drop nosuch
grep -q 'no snapshot named "nosuch"' "$tmpdir/run.err" || check_fail "drop nosuch: message: $(cat "$tmpdir/run.err")"
expect_st "refused: create of an existing name" 1 -S "$ctlsock" create snap1 --cow "$tmpdir/x.cow"
expect_st "usage: no command" 2 -S "$ctlsock"
expect_st "usage: unknown command" 2 -S "$ctlsock" frobnicate
expect_st "usage: drop without a name" 2 -S "$ctlsock" drop
expect_st "usage: status with two names" 2 -S "$ctlsock" status a b
expect_st "refused: create without --cow on a server without state=" 1 -S "$ctlsock" create x
expect_st "usage: an option of another command" 2 -S "$ctlsock" status --cow x
expect_st "usage: an unknown option" 2 -S "$ctlsock" status --frobnicate
expect_st "usage: --exceptions outside inspect" 2 -S "$ctlsock" status --exceptions
expect_st "usage: no socket" 2 status
expect_st "usage: a bad size" 2 -S "$ctlsock" set-block-size 4KiB
expect_st "unreachable: no such socket" 4 -S "$tmpdir/no-such.sock" status
grep -q "cannot connect" "$tmpdir/run.err" || check_fail "no socket: message: $(cat "$tmpdir/run.err")"
# A "server" that accepts and closes, one that answers garbage.
"$PY" -c '
import socket, sys, os
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8)
open(sys.argv[1] + ".ready", "w").close()
for reply in (b"", b"this is not json\n"):
    c, _ = s.accept(); c.recv(4096)
    if reply: c.sendall(reply)
    c.close()
' "$tmpdir/fake.sock" &
fake=$!
wait_until 30 test -e "$tmpdir/fake.sock.ready" || fail "the fake server did not start"
expect_st "unreachable: the server closes without a reply" 4 -S "$tmpdir/fake.sock" status
expect_st "unreachable: the reply is not JSON" 4 -S "$tmpdir/fake.sock" status
wait "$fake" || check_fail "the fake server failed"

# =====================================================================
info "=== 4. one line on success"
one_line() {  # WHAT REGEX ARGS...
    local what=$1 re=$2
    shift 2
    ctl "$ctlsock" "$@" || { check_fail "$what: exit $?: $(cat "$tmpdir/ctl.err")"; return 0; }
    if [ "$(wc -l <"$tmpdir/ctl.out")" = 1 ] && grep -qE "$re" "$tmpdir/ctl.out"; then
        info "ok: $what prints: $(cat "$tmpdir/ctl.out")"
    else
        check_fail "$what printed '$(cat "$tmpdir/ctl.out")', expected one line matching $re"
    fi
}
one_line "create" "^created snapshot snap2: transient store, chunk 65536, COW $tmpdir/snap2.cow\$" \
    create snap2 --cow "$tmpdir/snap2.cow" --store transient --chunk-size 64k
one_line "drop" "^dropped snapshot snap2" drop snap2
one_line "set-block-size" "4096" set-block-size 4096
one_line "set-block-size back" "512" set-block-size 512

# =====================================================================
info "=== 5. sizes with nbdkit's suffixes"
n=0
for s in 1048576 1048576b 1048576B 2048s 2048S 1024k 1024K 1m 1M " 1M" +1M; do
    n=$((n + 1))
    ctl "$ctlsock" --json create "z$n" --cow "$tmpdir/z$n.cow" --store transient --cow-size "$s" ||
        { check_fail "--cow-size $s: $(cat "$tmpdir/ctl.err")"; continue; }
    got=$(jq_py "$tmpdir/ctl.out" 'd["snapshot"]["total_bytes"]')
    [ "$got" = 1048576 ] && info "ok: --cow-size $s is 1 MiB" || check_fail "--cow-size $s gave total_bytes $got, expected 1048576"
    ctl "$ctlsock" drop "z$n" || check_fail "drop z$n"
done
ctl_ok "--chunk-size 8s (8 sectors)" "$ctlsock" --json create zc --cow "$tmpdir/zc.cow" --store transient --chunk-size 8s
[ "$(jq_py "$tmpdir/ctl.out" 'd["snapshot"]["chunk_size"]')" = 4096 ] || check_fail "--chunk-size 8s is not 4096"
ctl "$ctlsock" drop zc || check_fail "drop zc"
# Large suffixes reach the server (which refuses them as too large for a
# chunk, not as a bad size).
for s in 1g 1G 1t 1T 1p 1P 1e 1E; do
    ctl_refused "--chunk-size $s (reaches the server)" "1M" "$ctlsock" create zz --cow "$tmpdir/zz.cow" --chunk-size "$s"
done
for s in 1.5M 1KiB 1kb 0x10 -1 0 "" "5 M" "1M " - + 8E 16e; do
    expect_st "--cow-size '$s' refused" 2 -S "$ctlsock" create zz --cow "$tmpdir/zz.cow" --cow-size "$s"
done
[ ! -e "$tmpdir/zz.cow" ] || check_fail "a refused size left a COW file"

# =====================================================================
info "=== 6. status --json numbers"
ctl_ok "create snapP (persistent, 2M)" "$ctlsock" create snapP --cow "$tmpdir/snapP.cow" --cow-size 2M
cio writes "$(uri "$sock" origin)" --seed 7 --list "0:65536,1048576:8192" >/dev/null || fail "origin writes failed"
ctl_ok "status --json" "$ctlsock" --json status
"$PY" - "$tmpdir/ctl.out" <<'EOF' >"$tmpdir/numbers.check" || true
import json, re, sys
d = json.load(open(sys.argv[1]))
for s in d["snapshots"]:
    m = re.fullmatch(r"(\d+)/(\d+) (\d+)", s["status"])
    ok = True
    for k in ("allocated_bytes", "total_bytes", "metadata_bytes"):
        if not isinstance(s.get(k), int):
            print("BAD %s: %s is %r, not an integer" % (s["name"], k, s.get(k))); ok = False
    if not isinstance(s.get("percent"), (int, float)):
        print("BAD %s: percent is %r" % (s["name"], s.get("percent"))); continue
    if not ok or not m:
        print("BAD %s: status %r" % (s["name"], s["status"])); continue
    a, t, md = (int(x) * 512 for x in m.groups())
    want = round(100.0 * a / t, 2) if t else 0
    if (s["allocated_bytes"], s["total_bytes"], s["metadata_bytes"]) != (a, t, md):
        print("BAD %s: numbers %r vs status %r" % (s["name"], (s["allocated_bytes"], s["total_bytes"], s["metadata_bytes"]), s["status"]))
    elif abs(s["percent"] - want) > 0.005:
        print("BAD %s: percent %r, expected %r" % (s["name"], s["percent"], want))
    else:
        print("ok %s: %s = %d/%d/%d bytes, %.2f%%" % (s["name"], s["status"], a, t, md, s["percent"]))
names = [s["name"] for s in d["snapshots"]]
print(("ok" if "snapP" in names else "BAD") + " snapP is in the status")
p = [s for s in d["snapshots"] if s["name"] == "snapP"]
if p and not (p[0]["allocated_bytes"] > p[0]["metadata_bytes"] > 0 and p[0]["total_bytes"] == 2 << 20):
    print("BAD snapP: after 72K of origin writes: %r" % p[0])
EOF
while read -r verdict rest; do
    case $verdict in ok) info "ok: status numbers: $rest" ;; BAD) check_fail "status numbers: $rest" ;; esac
done <"$tmpdir/numbers.check"
[ -s "$tmpdir/numbers.check" ] || check_fail "the status number check did not run"

# =====================================================================
info "=== 7. --json inspect"
expect_st "inspect (human)" 0 inspect "$tmpdir/snapP.cow"
human_status=$(sed -n 's/^status: //p' "$tmpdir/run.out")
human_exc=$(sed -n 's/^exceptions: //p' "$tmpdir/run.out")
for args in "--json inspect" "inspect --json" "inspect --json --exceptions"; do
    # shellcheck disable=SC2086
    expect_st "$args" 0 $args "$tmpdir/snapP.cow"
    json_ok "$args" "$tmpdir/run.out"
    [ "$(jq_py "$tmpdir/run.out" 'd["status"]')" = "$human_status" ] &&
        [ "$(jq_py "$tmpdir/run.out" 'd["exceptions"]')" = "$human_exc" ] &&
        info "ok: $args: status '$human_status', $human_exc exceptions, as the human form" ||
        check_fail "$args: $(head -c 300 "$tmpdir/run.out") does not match status '$human_status', exceptions $human_exc"
done
[ "$(jq_py "$tmpdir/run.out" 'len(d["pairs"])')" = "$human_exc" ] && info "ok: --exceptions lists every pair in JSON" ||
    check_fail "inspect --json --exceptions: pairs: $(jq_py "$tmpdir/run.out" 'd.get("pairs")' | head -c 200)"

# =====================================================================
info "=== 8. stats --prometheus"
ctl_ok "create a snapshot with a quote and a backslash in its name" "$ctlsock" \
    create 'we"ird\name' --cow "$tmpdir/weird.cow" --store transient
ctl_ok "stats --prometheus" "$ctlsock" stats --prometheus
cp "$tmpdir/ctl.out" "$tmpdir/metrics.txt"
ctl_ok "stats --json" "$ctlsock" --json stats
cp "$tmpdir/ctl.out" "$tmpdir/stats.json"
ctl_ok "status --json" "$ctlsock" --json status
cp "$tmpdir/ctl.out" "$tmpdir/status.json"
"$PY" - "$tmpdir/metrics.txt" "$tmpdir/stats.json" "$tmpdir/status.json" <<'EOF' >"$tmpdir/prom.check" || true
# A strict parser of the Prometheus text exposition format 0.0.4.
import json, re, sys
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LNAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
problems = []
helps, types, series = {}, {}, {}
current = None
text = open(sys.argv[1], encoding="utf-8").read()
if not text.endswith("\n"):
    problems.append("the text does not end with a newline")
def parse_labels(s, lineno):
    labels, i = {}, 0
    while i < len(s):
        m = re.match(LNAME, s[i:])
        if not m or s[i + m.end():i + m.end() + 2] != '="':
            raise ValueError("line %d: bad label at %r" % (lineno, s[i:]))
        key = m.group(0); i += m.end() + 2
        val = ""
        while True:
            if i >= len(s):
                raise ValueError("line %d: unterminated label value" % lineno)
            c = s[i]
            if c == "\\":
                e = s[i + 1:i + 2]
                if e == "\\": val += "\\"
                elif e == '"': val += '"'
                elif e == "n": val += "\n"
                else: raise ValueError("line %d: bad escape \\%s" % (lineno, e))
                i += 2
            elif c == '"':
                i += 1; break
            elif c == "\n":
                raise ValueError("line %d: raw newline in a label" % lineno)
            else:
                val += c; i += 1
        if key in labels:
            raise ValueError("line %d: label %s twice" % (lineno, key))
        labels[key] = val
        if i < len(s):
            if s[i] != ",":
                raise ValueError("line %d: expected ',' at %r" % (lineno, s[i:]))
            i += 1
    return labels
for n, line in enumerate(text.split("\n")[:-1], 1):
    try:
        if line.startswith("#"):
            m = re.fullmatch(r"# (HELP|TYPE) (%s) (.*)" % NAME, line)
            if not m:
                raise ValueError("line %d: bad comment %r" % (n, line))
            kind, name, rest = m.groups()
            if kind == "HELP":
                if name in helps: raise ValueError("line %d: second HELP for %s" % (n, name))
                helps[name] = rest
            else:
                if rest not in ("counter", "gauge"): raise ValueError("line %d: type %r" % (n, rest))
                if name in types: raise ValueError("line %d: second TYPE for %s" % (n, name))
                if any(k == name for k, _ in series): raise ValueError("line %d: TYPE after samples of %s" % (n, name))
                types[name] = rest
            continue
        m = re.fullmatch(r"(%s)(?:\{(.*)\})? (\S+)" % NAME, line)
        if not m:
            raise ValueError("line %d: bad sample %r" % (n, line))
        name, lab, value = m.groups()
        labels = parse_labels(lab or "", n)
        float(value)
        if not name.startswith("snapfg_"): raise ValueError("line %d: %s lacks the snapfg_ prefix" % (n, name))
        if name not in types or name not in helps: raise ValueError("line %d: %s without HELP/TYPE before it" % (n, name))
        if types[name] == "counter" and not name.endswith("_total"): raise ValueError("line %d: counter %s not *_total" % (n, name))
        key = (name, tuple(sorted(labels.items())))
        if key in series: raise ValueError("line %d: duplicate series %r" % (n, key))
        series[key] = float(value)
    except ValueError as e:
        problems.append(str(e))
for p in problems[:10]:
    print("BAD " + p)
if problems:
    sys.exit(0)
print("ok %d lines, %d families, %d series, strictly well-formed" % (text.count("\n"), len(types), len(series)))
stats = {x["export"]: x for x in json.load(open(sys.argv[2]))["exports"]}
status = {x["name"]: x for x in json.load(open(sys.argv[3]))["snapshots"]}
def val(name, **labels):
    return series.get((name, tuple(sorted(labels.items()))))
checks = []
for e, x in stats.items():
    checks.append(("requests_total{export=%r} = %d" % (e, x["requests"]), val("snapfg_requests_total", export=e) == x["requests"]))
    checks.append(("written_bytes_total{export=%r}" % e, val("snapfg_written_bytes_total", export=e) == x["bytes_written"]))
    checks.append(("copy_outs_total{export=%r}" % e, val("snapfg_copy_outs_total", export=e) == x["copy_outs"]))
for s, x in status.items():
    checks.append(("cow_total_bytes{export=%r}" % s, val("snapfg_cow_total_bytes", export=s) == x["total_bytes"]))
    checks.append(("snapshot_state{export=%r,state=%r} = 1" % (s, x["state"]), val("snapfg_snapshot_state", export=s, state=x["state"]) == 1))
checks.append(("the label of 'we\"ird\\name' round-trips", val("snapfg_connections", export='we"ird\\name') is not None))
checks.append(("snapfg_snapshots = %d" % len(status), val("snapfg_snapshots") == len(status)))
for what, good in checks:
    print(("ok " if good else "BAD ") + what)
EOF
while read -r verdict rest; do
    case $verdict in ok) info "ok: prometheus: $rest" ;; BAD) check_fail "prometheus: $rest" ;; esac
done <"$tmpdir/prom.check"
[ -s "$tmpdir/prom.check" ] || check_fail "the Prometheus check did not run"
if have promtool; then
    promtool check metrics <"$tmpdir/metrics.txt" >"$tmpdir/promtool.out" 2>&1 &&
        info "ok: promtool check metrics accepts it" ||
        { cat "$tmpdir/promtool.out" >&2; check_fail "promtool check metrics refuses it"; }
else
    skip_part "promtool check metrics: promtool is not installed (the strict parser above ran)"
fi
expect_st "stats --prometheus --json refused" 2 -S "$ctlsock" stats --prometheus --json
expect_st "--prometheus on another command refused" 2 -S "$ctlsock" status --prometheus
ctl_ok "drop the odd name" "$ctlsock" drop 'we"ird\name'
ctl_ok "drop snap1" "$ctlsock" drop snap1

# =====================================================================
info "=== 9. merge --wait"
# snapP (persistent) holds the original contents of the chunks written
# above; more writes, then merge it back under a terminal.
cio writes "$(uri "$sock" origin)" --seed 8 --list "2097152:1048576" >/dev/null || fail "origin writes failed"
ctl "$ctlsock" --json status snapP || true
exc=$(jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["exceptions"]')
info "snapP holds $exc exceptions"
script -qec "timeout 300 $SNAPFGCTL -S $ctlsock merge snapP --wait" "$tmpdir/typescript" >/dev/null 2>&1 && st=0 || st=$?
tr '\r' '\n' <"$tmpdir/typescript" | sed 's/\x1b\[K//g' >"$tmpdir/merge.out"
[ "$st" = 0 ] && info "ok: merge --wait exited 0" || check_fail "merge --wait exited $st: $(cat "$tmpdir/merge.out")"
grep -qE "^merging snapP: [0-9]+ of $exc chunks \([0-9]+%\)" "$tmpdir/merge.out" &&
    info "ok: a progress line on the terminal: $(grep -m1 '^merging snapP' "$tmpdir/merge.out")" ||
    check_fail "no progress line on the terminal: $(head -c 500 "$tmpdir/merge.out")"
grep -qx "merged snapshot snapP into the origin" "$tmpdir/merge.out" &&
    info "ok: the last line says it is merged" || check_fail "merge --wait did not say it was merged"
ctl "$ctlsock" --json status || true
[ "$(jq_py "$tmpdir/ctl.out" 'len(d["snapshots"])')" = 0 ] && info "ok: snapP is gone when merge --wait returns" ||
    check_fail "after merge --wait: $(cat "$tmpdir/ctl.out")"
export_equals "$(uri "$sock" origin)" "$tmpdir/original.img" "after merge --wait, the origin is the original again"
# Without a terminal: no progress line, the same last line.
ctl_ok "create snapQ" "$ctlsock" create snapQ --cow "$tmpdir/snapQ.cow"
ctl_ok "merge snapQ --wait (no terminal)" "$ctlsock" merge snapQ --wait
[ "$(cat "$tmpdir/ctl.out")" = "merged snapshot snapQ into the origin" ] && [ ! -s "$tmpdir/ctl.err" ] &&
    info "ok: without a terminal, one line and no progress" ||
    check_fail "merge --wait without a terminal: stdout '$(cat "$tmpdir/ctl.out")', stderr '$(cat "$tmpdir/ctl.err")'"
ctl_ok "create snapR" "$ctlsock" create snapR --cow "$tmpdir/snapR.cow"
one_line "merge (without --wait)" "^merging snapshot snapR into the origin" merge snapR
wait_until 120 sh -c "! '$SNAPFGCTL' -S '$ctlsock' status snapR >/dev/null 2>&1" || check_fail "snapR's merge did not finish"

stop_nbdkit "$pid"
finish
