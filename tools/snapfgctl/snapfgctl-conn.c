/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl: talking to the server over its control socket.
 *
 * One JSON object per line each way; several requests may go over one
 * connection (merge --wait polls status, stats --prometheus asks for
 * status too), so what was read past a reply's newline is kept for the
 * next one.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <jansson.h>

#include "cleanup.h"
#include "full-io.h"
#include "snapfgctl.h"

int
conn_open (struct conn *cn, const char *path)
{
  struct sockaddr_un addr = { .sun_family = AF_UNIX };

  memset (cn, 0, sizeof *cn);
  cn->path = path;
  if (strlen (path) >= sizeof addr.sun_path) {
    fprintf (stderr, "snapfgctl: %s: socket path too long\n", path);
    return -1;
  }
  strcpy (addr.sun_path, path);
  cn->fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (cn->fd == -1 ||
      connect (cn->fd, (struct sockaddr *) &addr, sizeof addr) == -1) {
    fprintf (stderr, "snapfgctl: cannot connect to %s: %m\n", path);
    if (cn->fd >= 0)
      close (cn->fd);
    cn->fd = -1;
    return -1;
  }
  return 0;
}

void
conn_close (struct conn *cn)
{
  if (cn->fd >= 0)
    close (cn->fd);
  char_vector_reset (&cn->buf);
  cn->fd = -1;
}

/* Send one request, read its reply.  Returns the parsed reply (and the
 * line in *line if wanted, malloc'd), or NULL if the server could not be
 * talked to (said).
 */
json_t *
conn_call (struct conn *cn, json_t *req, char **line)
{
  CLEANUP_FREE char *text = json_dumps (req, JSON_COMPACT);
  size_t len;
  char *nl;
  json_error_t jerr;
  json_t *reply;

  if (text == NULL) {
    fprintf (stderr, "snapfgctl: out of memory\n");
    return NULL;
  }
  len = strlen (text);
  text[len] = '\n';             /* json_dumps's NUL becomes the newline */
  if (full_write (cn->fd, text, len + 1) < 0) {
    fprintf (stderr, "snapfgctl: writing to %s: %m\n", cn->path);
    return NULL;
  }

  while ((nl = cn->buf.len ? memchr (cn->buf.ptr, '\n', cn->buf.len)
          : NULL) == NULL) {
    ssize_t n;

    if (char_vector_reserve (&cn->buf, 4096) < 0) {
      fprintf (stderr, "snapfgctl: out of memory\n");
      return NULL;
    }
    n = read (cn->fd, cn->buf.ptr + cn->buf.len, cn->buf.cap - cn->buf.len);
    if (n == -1 && errno == EINTR)
      continue;
    if (n <= 0) {
      fprintf (stderr, "snapfgctl: no reply from %s%s%s\n", cn->path,
               n < 0 ? ": " : " (the connection was closed)",
               n < 0 ? strerror (errno) : "");
      return NULL;
    }
    cn->buf.len += n;
  }
  len = nl - cn->buf.ptr;
  reply = json_loadb (cn->buf.ptr, len, JSON_REJECT_DUPLICATES, &jerr);
  if (reply == NULL || !json_is_object (reply) ||
      !json_is_boolean (json_object_get (reply, "ok"))) {
    fprintf (stderr, "snapfgctl: unreadable reply from %s: %s\n", cn->path,
             reply ? "not an object with \"ok\"" : jerr.text);
    json_decref (reply);
    return NULL;
  }
  if (line) {
    *line = strndup (cn->buf.ptr, len + 1);
    if (*line == NULL) {
      json_decref (reply);
      return NULL;
    }
  }
  memmove (cn->buf.ptr, nl + 1, cn->buf.len - len - 1);
  cn->buf.len -= len + 1;
  return reply;
}

const char *
reply_error (json_t *reply)
{
  const char *msg = json_string_value (json_object_get (reply, "error"));

  return msg ? msg : "the server refused the request";
}
