#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
"""A tiny in-memory S3 endpoint that misbehaves on purpose, for what a
real gateway will not do on demand: answer 503 SlowDown, 500 for ever,
or store a PUT and then drop the connection before its reply.  It checks
no signature (test-repo-s3.sh checks those against Ceph).

  s3-fault-server.py PORTFILE MODE

MODE: "flaky"      the first 2 requests of each (method, path) get 503
      "broken"     every request gets 500 InternalError
      "lost-reply" the first PUT of each key is stored, then the
                   connection is closed without a reply
Writes the port it listens on (127.0.0.1) to PORTFILE.
"""
import sys
import threading
from collections import defaultdict
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit, parse_qs

portfile, mode = sys.argv[1], sys.argv[2]
objects = {}
seen = defaultdict(int)
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("s3-fault-server: " + (fmt % args) + "\n")

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code):
        self.reply(status, ("<?xml version=\"1.0\"?><Error><Code>%s</Code>"
                            "<Message>injected by s3-fault-server</Message>"
                            "</Error>" % code).encode())

    def handle_any(self):
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with lock:
            seen[(self.command, url.path)] += 1
            n = seen[(self.command, url.path)]
        if mode == "broken":
            return self.error(500, "InternalError")
        if mode == "flaky" and n <= 2:
            return self.error(503, "SlowDown")
        parts = url.path.lstrip("/").split("/", 1)
        key = parts[1] if len(parts) > 1 else ""
        if not key:
            if self.command != "GET":
                return self.error(405, "MethodNotAllowed")
            prefix = parse_qs(url.query).get("prefix", [""])[0]
            with lock:
                keys = sorted(k for k in objects if k.startswith(prefix))
            xml = "".join("<Contents><Key>%s</Key><LastModified>"
                          "2026-01-01T00:00:00.000Z</LastModified>"
                          "<Size>%d</Size></Contents>" % (k, len(objects[k]))
                          for k in keys)
            return self.reply(200, ("<ListBucketResult><IsTruncated>false"
                                    "</IsTruncated>%s</ListBucketResult>"
                                    % xml).encode())
        if self.command == "PUT":
            with lock:
                exists = key in objects
                if self.headers.get("If-None-Match") == "*" and exists:
                    conflict = True
                else:
                    conflict = False
                    objects[key] = body
            if conflict:
                return self.error(412, "PreconditionFailed")
            if mode == "lost-reply" and n == 1:
                # Stored, but the client never hears so.
                self.close_connection = True
                self.connection.shutdown(2)
                return
            return self.reply(200)
        with lock:
            data = objects.get(key)
        if data is None:
            return self.error(404, "NoSuchKey")
        if self.command == "DELETE":
            with lock:
                objects.pop(key, None)
            return self.reply(204)
        return self.reply(200, data, [
            ("Last-Modified", formatdate(1767225600, usegmt=True))])

    do_GET = do_PUT = do_HEAD = do_DELETE = handle_any


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(portfile + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os
os.rename(portfile + ".tmp", portfile)
server.serve_forever()
