#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Raw client for snapfg's control socket (control=), for the protocol
# level checks of test-control.sh.  It speaks the line protocol itself
# (control-protocol.h: one JSON object per line each way) rather than
# going through snapfgctl, so it can send what snapfgctl never would.
#
#   checks SOCK
#       Every protocol check below, each printed as it runs; exit 1 if
#       any failed.  The server must be running with no snapshot named
#       "nosuch".
#
#   request SOCK LINE
#       Send LINE (a newline is added), print the reply line.
#
#   watch SOCK NAME [--timeout S] [--expect-merging]
#       Poll status every 10 ms while snapshot NAME merges, until it is
#       gone.  Checks that merge_done never goes back nor past merge_total,
#       that merge_total stays put, that exceptions + merge_done stays
#       merge_total (within one batch of 16), and that the dm status line
#       of a merging snapshot is the usage line, not "Invalid" or
#       "Overflow".  Prints what it saw; exit 1 on a problem, or if it
#       never saw NAME merging and --expect-merging was given.
#
#   flood SOCK PID [--bytes N] [--seconds S]
#       A client that sends stats requests (up to N bytes, default 8 MiB,
#       for at most S seconds, default 20) and never reads a reply; PID
#       is the server's.  Meanwhile another client must still be served.
#       Prints how much was sent and the server's VmRSS before and after
#       (in KiB) as "sent=B rss_before=K rss_after=K"; exit 1 if the
#       other client was not served.
#
#   burst SOCK N
#       N clients connect at once (non-blocking connects one after the
#       other, before any is served); each must connect (no EAGAIN: the
#       listen backlog is large enough) and get its status reply.
#       Prints "connected=C eagain=E answered=A"; exit 1 unless all N
#       connected and were answered.
#
#   connect-denied SOCK
#       Meant to run as another user: connecting must fail with EACCES
#       (the socket is mode 0600), or, if it connects (root bypasses
#       the mode), the server must answer with a "permission denied"
#       error and close.  Prints what happened; exit 0 if refused.

import json
import os
import socket
import sys
import threading
import time

failures = 0


def say(msg):
    print("control-proto: " + msg, flush=True)


def ok(msg):
    say("ok: " + msg)


def bad(msg):
    global failures
    failures += 1
    print("control-proto: FAIL: " + msg, file=sys.stderr, flush=True)


def connect(path, timeout=20):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # A blocking connect, as snapfgctl's: with a timeout set, a full
    # listen backlog would fail at once with EAGAIN instead of waiting.
    s.connect(path)
    s.settimeout(timeout)
    return s


class Conn:
    """A connection with a line reader."""

    def __init__(self, path, timeout=20):
        self.s = connect(path, timeout)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def line(self):
        """The next reply line (without its newline), or None at EOF."""
        while b"\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                return None
            self.buf += d
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def reply(self):
        """The next reply, parsed; raises on EOF or invalid JSON."""
        line = self.line()
        if line is None:
            raise EOFError("the server closed the connection without a reply")
        try:
            d = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError("reply is not valid JSON (%s): %r" % (e, line[:300]))
        if not isinstance(d, dict) or not isinstance(d.get("ok"), bool):
            raise ValueError("reply lacks a boolean \"ok\": %r" % line[:300])
        return d

    def close(self):
        self.s.close()


def exchange(path, data, conn=None):
    """Send data on conn, or on a new connection closed afterwards, and
    return the reply (see Conn.reply)."""
    c = conn or Conn(path)
    try:
        c.send(data)
        return c.reply()
    finally:
        if conn is None:
            c.close()


def expect_error(path, what, data, fragment, conn=None):
    """Send data (one or more bytes ending in a newline): the reply must be
    ok:false with fragment in its error message."""
    try:
        d = exchange(path, data, conn)
    except Exception as e:
        bad("%s: %s" % (what, e))
        return False
    if d["ok"] is not False:
        bad("%s: accepted; expected an error (reply %r)" % (what, d))
        return False
    msg = d.get("error")
    if not isinstance(msg, str) or not msg:
        bad("%s: error reply without a message: %r" % (what, d))
        return False
    if fragment not in msg:
        bad("%s: error message %r lacks %r" % (what, msg, fragment))
        return False
    ok("%s: refused: %s" % (what, msg))
    return True


def expect_ok(path, what, data, conn=None, check=None):
    """Send data: the reply must be ok:true (and pass check, if given).
    Returns the reply, or None."""
    try:
        d = exchange(path, data, conn)
    except Exception as e:
        bad("%s: %s" % (what, e))
        return None
    if d["ok"] is not True:
        bad("%s: refused: %r" % (what, d))
        return None
    try:
        good = check is None or check(d)
    except Exception:
        good = False
    if not good:
        bad("%s: unexpected reply %r" % (what, d))
        return None
    ok(what)
    return d


def is_status(d):
    return isinstance(d.get("origin"), dict) and isinstance(d.get("snapshots"), list)


STATUS = b'{"cmd":"status"}\n'


def server_alive(path, what):
    expect_ok(path, "%s: the server still answers status" % what, STATUS,
              check=is_status)


def check_malformed(path):
    say("malformed requests each get an error reply with a message")
    cases = [
        ("truncated JSON object", b'{"cmd":"status"\n', "not a JSON request"),
        ("not JSON at all", b"hello server\n", "not a JSON request"),
        ("trailing garbage after the object", b'{"cmd":"status"} x\n',
         "not a JSON request"),
        ("bad string escape", b'{"cmd":"stat\\qus"}\n', "not a JSON request"),
        ("unterminated string", b'{"cmd":"status\n', "not a JSON request"),
        ("invalid UTF-8 / control byte in a string",
         b'{"cmd":"status","name":"a\x01b"}\n', ""),
        ("empty line", b"\n", "not a JSON request"),
        ("a JSON array, not an object", b'["status"]\n', "JSON object"),
        ("a JSON string, not an object", b'"status"\n', "JSON object"),
        ("no \"cmd\"", b'{"name":"x"}\n', "cmd"),
        ("\"cmd\" not a string", b'{"cmd":5}\n', "cmd"),
        ("\"cmd\" null", b'{"cmd":null}\n', "cmd"),
        ("unknown command", b'{"cmd":"frobnicate"}\n', "unknown command"),
        ("command name with different case", b'{"cmd":"STATUS"}\n',
         "unknown command"),
        ("unexpected key for list", b'{"cmd":"list","name":"x"}\n',
         "unexpected"),
        ("unexpected key for stats", b'{"cmd":"stats","verbose":true}\n',
         "unexpected"),
        ("unexpected key for create",
         b'{"cmd":"create","name":"a","cow":"/tmp/x","colour":"red"}\n',
         "unexpected"),
        ("unexpected key for drop", b'{"cmd":"drop","name":"a","force":true}\n',
         "unexpected"),
        ("set-block-size with a name", b'{"cmd":"set-block-size","block_size":512,"name":"a"}\n',
         "unexpected"),
        ("create without \"cow\"", b'{"cmd":"create","name":"a"}\n', "cow"),
        ("create without \"name\"", b'{"cmd":"create","cow":"/tmp/a"}\n', "name"),
        ("drop without \"name\"", b'{"cmd":"drop"}\n', "name"),
        ("merge without \"name\"", b'{"cmd":"merge"}\n', "name"),
        ("changed without \"name\"", b'{"cmd":"changed"}\n', "name"),
        ("set-block-size without \"block_size\"", b'{"cmd":"set-block-size"}\n',
         "block_size"),
        ("\"name\" a number", b'{"cmd":"drop","name":7}\n', "name"),
        ("\"name\" empty", b'{"cmd":"status","name":""}\n', "name"),
        ("\"chunk_size\" a string",
         b'{"cmd":"create","name":"a","cow":"/tmp/a","chunk_size":"4K"}\n',
         "chunk_size"),
        ("\"chunk_size\" negative",
         b'{"cmd":"create","name":"a","cow":"/tmp/a","chunk_size":-4096}\n',
         "chunk_size"),
        ("\"chunk_size\" fractional",
         b'{"cmd":"create","name":"a","cow":"/tmp/a","chunk_size":4096.5}\n',
         "chunk_size"),
        ("\"chunk_size\" beyond 32 bits",
         b'{"cmd":"create","name":"a","cow":"/tmp/a","chunk_size":4294971392}\n',
         "chunk-size=4294971392: must be between 512 and 1M"),
        ("\"block_size\" zero", b'{"cmd":"set-block-size","block_size":0}\n',
         "block_size"),
        ("\"block_size\" with an exponent",
         b'{"cmd":"set-block-size","block_size":4.096e3}\n', "block_size"),
        ("\"block_size\" beyond 64 bits",
         b'{"cmd":"set-block-size","block_size":99999999999999999999999}\n',
         "too big integer"),
        ("\"block_size\" 1024", b'{"cmd":"set-block-size","block_size":1024}\n',
         "512 or 4096"),
        ("\"block_size\" 4096 + 2^32 (must not wrap to 4096)",
         b'{"cmd":"set-block-size","block_size":4294971392}\n', "512 or 4096"),
        ("relative COW path (the server runs in /)",
         b'{"cmd":"create","name":"rel","cow":"relative.cow"}\n', "absolute"),
        ("NUL byte inside the line", b'{"cmd":"status"}\x00garbage\n', "NUL"),
        ("nesting 200 deep", b"[" * 200 + b"]" * 200 + b"\n", ""),
        ("status of an unknown snapshot", b'{"cmd":"status","name":"nosuch"}\n',
         "nosuch"),
        ("name with quotes and a newline escape",
         b'{"cmd":"status","name":"a\\"b\\nc\\u00e9"}\n', "no snapshot"),
    ]
    for what, data, frag in cases:
        expect_error(path, what, data, frag)
    # All of them on one connection, too: an error never closes it.
    c = Conn(path)
    try:
        for what, data, frag in cases:
            c.send(data)
            d = c.reply()
            if d["ok"] is not False:
                raise ValueError("%s: accepted on the shared connection" % what)
        d = expect_ok(path, "after %d bad requests on one connection, a good "
                      "one on the same connection works" % len(cases),
                      STATUS, conn=c, check=is_status)
    except Exception as e:
        bad("bad requests on one connection: %s" % e)
    finally:
        c.close()
    server_alive(path, "after the malformed requests")


def check_framing(path):
    say("line framing")
    expect_ok(path, "a CRLF-terminated request is accepted",
              b'{"cmd":"status"}\r\n', check=is_status)
    expect_ok(path, "whitespace around the object is accepted",
              b'  \t{ "cmd" : "list" }  \n', check=is_status)
    # Two requests in one write: two replies, in order.
    c = Conn(path)
    try:
        c.send(b'{"cmd":"list"}\n{"cmd":"nope"}\n{"cmd":"stats"}\n')
        a, b, s = c.reply(), c.reply(), c.reply()
        if a["ok"] and is_status(a) and not b["ok"] and s["ok"] and "exports" in s:
            ok("three pipelined requests in one write get three replies in order")
        else:
            bad("pipelined requests: replies %r %r %r" % (a, b, s))
    except Exception as e:
        bad("pipelined requests: %s" % e)
    finally:
        c.close()
    # One request dribbled a byte at a time.
    c = Conn(path)
    try:
        for i in range(len(STATUS)):
            c.send(STATUS[i:i + 1])
            time.sleep(0.002)
        d = c.reply()
        if d["ok"] and is_status(d):
            ok("a request sent one byte at a time gets one reply")
        else:
            bad("byte-at-a-time request: %r" % d)
        c.s.settimeout(0.3)
        try:
            extra = c.s.recv(100)
            if extra:
                bad("byte-at-a-time request: extra output %r" % extra)
        except socket.timeout:
            pass
    except Exception as e:
        bad("byte-at-a-time request: %s" % e)
    finally:
        c.close()
    # Many requests written before reading any reply (the server must
    # queue its replies, not drop them or block).
    n = 2000
    c = Conn(path, timeout=60)
    try:
        sender = threading.Thread(target=lambda: c.send(STATUS * n))
        sender.start()
        got = 0
        for _ in range(n):
            d = c.reply()
            if not (d["ok"] and is_status(d)):
                raise ValueError("reply %d: %r" % (got, d))
            got += 1
        sender.join()
        ok("%d requests sent back to back without reading: %d replies" % (n, got))
    except Exception as e:
        bad("back-to-back requests: %s" % e)
    finally:
        c.close()


def check_long_lines(path):
    say("over-long lines (limit: 4096 bytes without the newline)")
    pad = lambda n: b'{"cmd":"list"}' + b" " * (n - len(b'{"cmd":"list"}'))
    for n in (4095, 4096):
        c = Conn(path)
        try:
            c.send(pad(n) + b"\n")
            d = c.reply()
            if d["ok"]:
                ok("a valid request of exactly %d bytes is accepted" % n)
            else:
                bad("a valid request of exactly %d bytes (within the %d-byte "
                    "limit) is refused: %r" % (n, 4096, d))
        except Exception as e:
            bad("a request of %d bytes: %s" % (n, e))
        finally:
            c.close()
    for n, how in ((4097, "one write"), (5000, "one write"),
                   (100000, "one write"), (10000, "pieces of 1000 bytes")):
        c = Conn(path)
        try:
            data = pad(n) + b"\n"
            if how == "one write":
                c.send(data)
            else:
                for i in range(0, len(data), 1000):
                    c.send(data[i:i + 1000])
                    time.sleep(0.001)
            d = c.reply()
            if d["ok"] is not False or "longer than 4096" not in d.get("error", ""):
                bad("a %d-byte line (%s): expected \"request longer than 4096 "
                    "bytes\", got %r" % (n, how, d))
            else:
                ok("a %d-byte line (%s) is refused: %s" % (n, how, d["error"]))
            # Exactly one reply for the long line, then the same
            # connection serves a valid request.
            c.send(STATUS)
            d = c.reply()
            if d["ok"] and is_status(d):
                ok("after the %d-byte line, a valid request on the same "
                   "connection works" % n)
            else:
                bad("after the %d-byte line, the next request got %r "
                    "(a second reply for the long line?)" % (n, d))
        except Exception as e:
            bad("a %d-byte line: %s" % (n, e))
        finally:
            c.close()
    # Long line and a valid request in the same write.
    c = Conn(path)
    try:
        c.send(b"x" * 9000 + b"\n" + STATUS)
        a, b = c.reply(), c.reply()
        if a["ok"] is False and b["ok"] and is_status(b):
            ok("a long line and a valid request in one write: error, then the answer")
        else:
            bad("long line + request in one write: %r %r" % (a, b))
    except Exception as e:
        bad("long line + request in one write: %s" % e)
    finally:
        c.close()
    server_alive(path, "after the long lines")


def check_disconnects(path):
    say("clients that go away")
    # Disconnect in the middle of a line.
    for i in range(20):
        s = connect(path)
        s.sendall(b'{"cmd":"create","name":"half%d","cow":"/tm' % i)
        s.close()
    time.sleep(0.2)
    d = expect_ok(path, "20 clients hung up mid-line; a new client is answered",
                  STATUS, check=is_status)
    if d is not None:
        names = [x.get("name") for x in d["snapshots"]]
        if any(str(n).startswith("half") for n in names):
            bad("a half-sent create request was executed: %r" % names)
        else:
            ok("no half-sent request was executed")
    # Half-close after a partial line: no reply for the fragment, EOF.
    c = Conn(path)
    try:
        c.send(b'{"cmd":"status"')
        c.s.shutdown(socket.SHUT_WR)
        line = c.line()
        if line is None:
            ok("a partial line followed by EOF gets no reply; the server closes")
        else:
            bad("a partial line followed by EOF got a reply: %r" % line)
    except Exception as e:
        bad("partial line then EOF: %s" % e)
    finally:
        c.close()
    # A complete request, then EOF before reading: the reply is still sent.
    c = Conn(path)
    try:
        c.send(STATUS)
        c.s.shutdown(socket.SHUT_WR)
        d = c.reply()
        if d["ok"] and c.line() is None:
            ok("request then EOF: the reply is delivered, then the server closes")
        else:
            bad("request then EOF: %r" % d)
    except Exception as e:
        bad("request then EOF: %s" % e)
    finally:
        c.close()
    # Hang up without reading replies to many requests.
    for _ in range(5):
        s = connect(path)
        s.sendall(STATUS * 500)
        s.close()
    time.sleep(0.2)
    server_alive(path, "after clients hung up with replies unread")


def check_concurrent(path, nclients=20, rounds=10):
    say("%d concurrent clients" % nclients)
    barrier = threading.Barrier(nclients)
    errors = []
    counts = [0] * nclients

    def client(i):
        try:
            c = Conn(path, timeout=60)
            barrier.wait(timeout=60)    # all connected at once
            for r in range(rounds):
                for req, want in ((STATUS, "origin"), (b'{"cmd":"list"}\n', "snapshots"),
                                  (b'{"cmd":"stats"}\n', "exports")):
                    c.send(req)
                    d = c.reply()
                    if not d["ok"] or want not in d:
                        raise ValueError("reply %r" % d)
                    counts[i] += 1
                c.send(b'{"cmd":"drop","name":"nosuch-%d"}\n' % i)
                d = c.reply()
                if d["ok"] or ("nosuch-%d" % i) not in d.get("error", ""):
                    raise ValueError("error reply mixed up: %r" % d)
                counts[i] += 1
            c.close()
        except Exception as e:
            errors.append("client %d: %s" % (i, e))

    # And an idle client holding a connection open all along.
    idle = Conn(path)
    ts = [threading.Thread(target=client, args=(i,)) for i in range(nclients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        for e in errors[:5]:
            bad("concurrent clients: " + e)
    else:
        ok("%d concurrent clients, %d requests each, every reply right "
           "(and each client got its own error messages)"
           % (nclients, counts[0]))
    expect_ok(path, "the idle client opened first is still served", STATUS,
              conn=idle, check=is_status)
    idle.close()


def cmd_checks(path):
    check_malformed(path)
    check_framing(path)
    check_long_lines(path)
    check_disconnects(path)
    check_concurrent(path)
    if failures:
        say("%d protocol check(s) failed" % failures)
        sys.exit(1)
    say("all protocol checks passed")


def cmd_request(path, line):
    c = Conn(path)
    c.send(line.encode() + b"\n")
    r = c.line()
    print(r.decode() if r is not None else "(EOF)")
    c.close()


def cmd_connect_denied(path):
    try:
        c = Conn(path, timeout=10)
    except PermissionError:
        print("EACCES (uid %d: connect refused by the socket's mode)" % os.getuid())
        return 0
    except OSError as e:
        print("connect failed: %s" % e)
        return 1
    # A refused client is told so at once, without asking anything; an
    # accepted one hears nothing until it sends a request.
    line = None
    try:
        c.s.settimeout(2)
        try:
            line = c.line()
        except socket.timeout:
            c.s.settimeout(10)
            c.send(STATUS)
            line = c.line()
    except OSError as e:
        print("connected, then the connection failed without a reply: %s" % e)
        return 1
    if line is None:
        print("connected, then closed without a reply")
        return 1
    try:
        d = json.loads(line)
    except ValueError:
        print("connected, unreadable reply %r" % line)
        return 1
    if d.get("ok") is False and "permission denied" in d.get("error", ""):
        try:
            rest = c.line()
        except OSError:
            rest = None
        print("refused by the server: %s%s" % (d["error"],
              "" if rest is None else " (but the connection stayed open!)"))
        return 0 if rest is None else 1
    print("ACCEPTED: %s" % line[:200])
    return 1


def cmd_watch(path, name, timeout, expect_merging):
    import re
    deadline = time.monotonic() + timeout
    polls = seen = 0
    first = last = None
    total = None
    problems = []
    states = {}
    statuses = set()
    gone = False
    c = Conn(path)
    while time.monotonic() < deadline:
        c.send(STATUS)
        d = c.reply()
        polls += 1
        snap = [x for x in d.get("snapshots", []) if x.get("name") == name]
        if not snap:
            gone = True
            break
        x = snap[0]
        states[x.get("state")] = states.get(x.get("state"), 0) + 1
        if x.get("state") == "merging":
            seen += 1
            done, tot, exc = x.get("merge_done"), x.get("merge_total"), x.get("exceptions")
            if not all(isinstance(v, int) for v in (done, tot, exc)):
                problems.append("merging without integer merge_done/"
                                "merge_total/exceptions: %r" % x)
                break
            if total is None:
                total = tot
            if tot != total:
                problems.append("merge_total changed from %d to %d" % (total, tot))
            if last is not None and done < last:
                problems.append("merge_done went back from %d to %d" % (last, done))
            if done > tot:
                problems.append("merge_done %d > merge_total %d" % (done, tot))
            if not (tot - 16 <= exc + done <= tot):
                problems.append("exceptions %d + merge_done %d != merge_total %d"
                                % (exc, done, tot))
            if first is None:
                first = done
            last = done
            st = x.get("status", "")
            if not re.fullmatch(r"[0-9]+/[0-9]+ [0-9]+", st):
                statuses.add(st)
        time.sleep(0.01)
    c.close()
    if not gone:
        problems.append("%s still there after %d s" % (name, timeout))
    if statuses:
        problems.append("the dm status line of the merging snapshot is %s, "
                        "not \"<allocated>/<total> <metadata>\" (it is "
                        "being merged, not Invalid)" % sorted(statuses))
    if seen:
        say("watched %s: %d polls, %d while merging: merge_done %d .. %d of "
            "%d; states seen %r; gone at the end: %s"
            % (name, polls, seen, first, last, total, states, gone))
    else:
        say("watched %s: %d polls, never saw it merging (states %r); gone: %s"
            % (name, polls, states, gone))
        if expect_merging:
            problems.append("never saw %s merging" % name)
    for p in problems[:10]:
        bad(p)
    return 1 if problems else 0


def vmrss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise ValueError("no VmRSS for pid %d" % pid)


def cmd_flood(path, pid, nbytes, seconds):
    before = vmrss_kib(pid)
    req = b'{"cmd":"stats"}\n'
    chunk = req * 4096
    s = connect(path)
    s.settimeout(0.5)
    sent = 0
    deadline = time.monotonic() + seconds
    # Send until the server stops reading (our socket buffers fill up and
    # sends time out) for a while, the byte budget is spent, or time is up.
    stalled_since = None
    while sent < nbytes and time.monotonic() < deadline:
        try:
            n = s.send(chunk[:min(len(chunk), nbytes - sent)])
            sent += n
            stalled_since = None
        except socket.timeout:
            if stalled_since is None:
                stalled_since = time.monotonic()
            elif time.monotonic() - stalled_since > 3:
                break
    time.sleep(1)                       # let the server catch up, if it reads
    after = vmrss_kib(pid)
    served = True
    try:
        c = Conn(path, timeout=30)
        c.send(STATUS)
        d = c.reply()
        served = bool(d["ok"] and is_status(d))
        c.close()
    except Exception as e:
        say("another client, while the flooding one is stalled: %s" % e)
        served = False
    print("sent=%d rss_before=%d rss_after=%d served=%s" % (sent, before, after,
                                                           served), flush=True)
    s.close()
    return 0 if served else 1


def cmd_burst(path, n):
    socks = []
    eagain = 0
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
            socks.append(s)
        except BlockingIOError:
            eagain += 1
            s.close()
    answered = 0
    for s in socks:
        s.setblocking(True)
        s.settimeout(60)
    for s in socks:
        s.sendall(STATUS)
    for s in socks:
        buf = b""
        try:
            while b"\n" not in buf:
                d = s.recv(65536)
                if not d:
                    break
                buf += d
            if json.loads(buf.split(b"\n")[0]).get("ok") is True:
                answered += 1
        except (OSError, ValueError) as e:
            say("burst: %s" % e)
        s.close()
    print("connected=%d eagain=%d answered=%d" % (len(socks), eagain, answered))
    return 0 if len(socks) == n and answered == n else 1


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "flood":
        a = sys.argv
        sys.exit(cmd_flood(a[2], int(a[3]),
                           int(a[a.index("--bytes") + 1]) if "--bytes" in a else 8 << 20,
                           float(a[a.index("--seconds") + 1]) if "--seconds" in a else 20))
    if len(sys.argv) >= 4 and sys.argv[1] == "burst":
        sys.exit(cmd_burst(sys.argv[2], int(sys.argv[3])))
    if len(sys.argv) >= 4 and sys.argv[1] == "watch":
        sys.exit(cmd_watch(sys.argv[2], sys.argv[3],
                           float(sys.argv[sys.argv.index("--timeout") + 1])
                           if "--timeout" in sys.argv else 60,
                           "--expect-merging" in sys.argv))
    if len(sys.argv) < 3:
        sys.exit("usage: control-proto.py checks|request|connect-denied SOCK [LINE]")
    cmd, path = sys.argv[1], sys.argv[2]
    if cmd == "checks":
        cmd_checks(path)
    elif cmd == "request":
        cmd_request(path, sys.argv[3])
    elif cmd == "connect-denied":
        sys.exit(cmd_connect_denied(path))
    else:
        sys.exit("unknown subcommand " + cmd)


if __name__ == "__main__":
    main()
