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

#include "snapfg-backup.h"

static int
write_all (int fd, const char *buf, size_t len)
{
  while (len > 0) {
    ssize_t n = write (fd, buf, len);
    if (n == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    buf += n;
    len -= n;
  }
  return 0;
}

json_t *
control_call (const char *socket_path, json_t *req, char *err, size_t err_len)
{
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  char *line = NULL, *text;
  size_t len = 0, cap = 0;
  json_t *reply, *ok;
  json_error_t jerr;
  const char *cmd = json_string_value (json_object_get (req, "cmd"));
  int fd;

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
    if (fd >= 0)
      close (fd);
    return NULL;
  }

  text = json_dumps (req, JSON_COMPACT);
  if (text == NULL) {
    snprintf (err, err_len, "out of memory");
    close (fd);
    return NULL;
  }
  if (write_all (fd, text, strlen (text)) == -1 ||
      write_all (fd, "\n", 1) == -1) {
    snprintf (err, err_len, "writing to %s: %s", socket_path,
              strerror (errno));
    free (text);
    close (fd);
    return NULL;
  }
  free (text);

  for (;;) {
    ssize_t n;

    if (cap - len < 4096) {
      char *p = realloc (line, cap * 2 + 8192);
      if (p == NULL) {
        snprintf (err, err_len, "out of memory reading the reply");
        free (line);
        close (fd);
        return NULL;
      }
      line = p;
      cap = cap * 2 + 8192;
    }
    n = read (fd, line + len, cap - len - 1);
    if (n == -1 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    len += n;
    if (memchr (line + len - n, '\n', n))
      break;
  }
  close (fd);
  if (len == 0) {
    snprintf (err, err_len, "no reply from %s to \"%s\"", socket_path,
              cmd ? cmd : "?");
    free (line);
    return NULL;
  }
  reply = json_loadb (line, len, JSON_DISABLE_EOF_CHECK, &jerr);
  free (line);
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
