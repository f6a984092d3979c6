/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the control socket client.
 *
 * One JSON object per line each way (see snapfgctl(1), PROTOCOL).  A
 * connection per request keeps the client simple; the server accepts
 * any number of them.  Replies can be long (a "changed" reply lists
 * every range), so the reply is read until its newline, however long.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "cleanup.h"
#include "full-io.h"
#include "snapfg-backup.h"
#include "vector.h"


json_t *
control_call (const char *socket_path, json_t *req, char *err, size_t err_len)
{
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  CLEANUP (char_vector_reset) char_vector line = { 0 };
  CLEANUP_FREE char *text = NULL;
  CLEANUP_CLOSE int fd = -1;
  json_t *reply, *ok;
  json_error_t jerr;
  const char *cmd = json_string_value (json_object_get (req, "cmd"));

  if (strlen (socket_path) >= sizeof addr.sun_path) {
    snprintf (err, err_len, "%s: control socket path too long", socket_path);
    return NULL;
  }
  strcpy (addr.sun_path, socket_path);
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1 || connect (fd, (struct sockaddr *) &addr, sizeof addr) == -1) {
    snprintf (err, err_len, "cannot connect to the control socket %s: %s "
              "(is the server running with control=%s?)",
              socket_path, strerror (errno), socket_path);
    return NULL;
  }

  text = json_dumps (req, JSON_COMPACT);
  if (text == NULL) {
    snprintf (err, err_len, "out of memory");
    return NULL;
  }
  if (full_write (fd, text, strlen (text)) < 0 ||
      full_write (fd, "\n", 1) < 0) {
    snprintf (err, err_len, "writing to %s: %s", socket_path,
              strerror (errno));
    return NULL;
  }

  for (;;) {
    ssize_t n;

    /* Room for a read of at least 4K and the terminating byte. */
    if (char_vector_reserve (&line, 4096 + 1) < 0) {
      snprintf (err, err_len, "out of memory reading the reply");
      return NULL;
    }
    n = read (fd, line.ptr + line.len, line.cap - line.len - 1);
    if (n == -1 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    line.len += n;
    if (memchr (line.ptr + line.len - n, '\n', n))
      break;
  }
  if (line.len == 0) {
    snprintf (err, err_len, "no reply from %s to \"%s\"", socket_path,
              cmd ? cmd : "?");
    return NULL;
  }
  reply = json_loadb (line.ptr, line.len, JSON_DISABLE_EOF_CHECK, &jerr);
  if (reply == NULL || !json_is_object (reply)) {
    snprintf (err, err_len, "unreadable reply from %s to \"%s\": %s",
              socket_path, cmd ? cmd : "?", reply ? "not an object" : jerr.text);
    json_decref (reply);
    return NULL;
  }
  ok = json_object_get (reply, "ok");
  if (!json_is_true (ok)) {
    const char *msg = json_string_value (json_object_get (reply, "error"));
    snprintf (err, err_len, "%s", msg ? msg : "the server refused the request");
    json_decref (reply);
    return NULL;
  }
  return reply;
}
