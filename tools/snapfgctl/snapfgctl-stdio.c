/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl --stdio: the control socket on standard input and output.
 *
 * For a client on another machine that reaches this one by ssh
 * (snapfg-backup -H runs "ssh HOST snapfgctl --stdio -S SOCKET"): each
 * request line read from stdin goes to the control socket, its reply
 * line to stdout, in order, one at a time.  Requests are forwarded as
 * they are (re-encoded, so one request is always one line); the
 * server checks them.
 *
 * With --drop-on-hangup, a snapshot created through this bridge and not
 * dropped through it when stdin ends (the ssh connection was lost, or
 * the client died) is dropped then: a backup cut off mid-copy leaves no
 * snapshot holding COW space on the server.  Checkpoints are left alone:
 * whether a checkpoint is still needed is known only to the client's
 * chain (its next run drops those it does not need).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <jansson.h>

#include "control-client.h"
#include "snapfgctl.h"
#include "tool-exit.h"
#include "vector.h"

DEFINE_VECTOR_TYPE (name_vector, char *);

static int
write_line (const char *text, size_t len)
{
  while (len > 0) {
    ssize_t n = write (STDOUT_FILENO, text, len);
    if (n == -1 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    text += n;
    len -= n;
  }
  return 0;
}

/* Remember the snapshots created and forget those dropped. */
static void
track (name_vector *held, json_t *req, json_t *reply)
{
  const char *cmd = json_string_value (json_object_get (req, "cmd"));
  const char *name = json_string_value (json_object_get (req, "name"));

  if (cmd == NULL || name == NULL ||
      !json_is_true (json_object_get (reply, "ok")))
    return;
  if (strcmp (cmd, "create") == 0) {
    char *copy = strdup (name);
    if (copy && name_vector_append (held, copy) < 0)
      free (copy);
  }
  else if (strcmp (cmd, "drop") == 0 || strcmp (cmd, "merge") == 0) {
    for (size_t i = 0; i < held->len; ++i)
      if (strcmp (held->ptr[i], name) == 0) {
        free (held->ptr[i]);
        name_vector_remove (held, i);
        break;
      }
  }
}

static void
drop_held (struct control_client *c, name_vector *held)
{
  for (size_t i = 0; i < held->len; ++i) {
    json_t *req = control_request (CONTROL_DROP), *reply;

    control_request_set_string (req, "name", held->ptr[i]);
    reply = control_client_call (c, req, NULL);
    if (reply && json_is_true (json_object_get (reply, "ok")))
      tool_error ("--stdio: the client went away: dropped "
                  "snapshot %s", held->ptr[i]);
    else
      tool_error ("--stdio: the client went away; dropping "
                  "snapshot %s failed: %s", held->ptr[i],
                  reply ? control_reply_error (reply) : c->error);
    json_decref (reply);
    json_decref (req);
  }
}

int
snapfgctl_stdio (const char *socket_path, int timeout, bool drop_on_hangup)
{
  struct control_client c;
  char_vector in = { 0 };
  name_vector held = { 0 };
  int status = TOOL_EXIT_OK;
  bool eof = false;

  /* The client's side closing is the normal end, not a signal's. */
  signal (SIGPIPE, SIG_IGN);
  signal (SIGHUP, SIG_IGN);
  if (control_client_connect (&c, socket_path, timeout) == -1) {
    tool_error ("%s", c.error);
    return TOOL_EXIT_UNREACHABLE;
  }

  while (!eof || in.len > 0) {
    char *nl = in.len ? memchr (in.ptr, '\n', in.len) : NULL;
    json_t *req, *reply;
    json_error_t jerr;
    char *line = NULL;
    size_t len;

    if (nl == NULL && !eof) {
      ssize_t n;
      if (char_vector_reserve (&in, 4096) < 0) {
        tool_error ("out of memory");
        status = TOOL_EXIT_FAILED;
        break;
      }
      n = read (STDIN_FILENO, in.ptr + in.len, in.cap - in.len);
      if (n == -1 && errno == EINTR)
        continue;
      if (n <= 0)
        eof = true;
      else
        in.len += n;
      continue;
    }
    len = nl ? (size_t) (nl - in.ptr) : in.len;
    req = json_loadb (in.ptr, len, JSON_REJECT_DUPLICATES, &jerr);
    memmove (in.ptr, in.ptr + len + (nl != NULL), in.len - len - (nl != NULL));
    in.len -= len + (nl != NULL);
    if (req == NULL || !json_is_object (req)) {
      json_t *err = json_pack ("{s:b, s:s+}", "ok", 0, "error",
                               "snapfgctl --stdio: not a JSON object: ",
                               req ? "another JSON value" : jerr.text);
      char *text = err ? json_dumps (err, JSON_COMPACT) : NULL;
      if (text == NULL || write_line (text, strlen (text)) == -1 ||
          write_line ("\n", 1) == -1)
        eof = true;
      free (text);
      json_decref (err);
      json_decref (req);
      continue;
    }
    reply = control_client_call (&c, req, &line);
    if (reply == NULL) {
      tool_error ("--stdio: %s", c.error);
      status = control_client_exit_status (&c);
      json_decref (req);
      break;
    }
    track (&held, req, reply);
    json_decref (req);
    json_decref (reply);
    if (write_line (line, strlen (line)) == -1 || write_line ("\n", 1) == -1)
      eof = true, in.len = 0;   /* the client is gone */
    free (line);
  }

  if (drop_on_hangup && c.rfd >= 0)
    drop_held (&c, &held);
  for (size_t i = 0; i < held.len; ++i)
    free (held.ptr[i]);
  name_vector_reset (&held);
  char_vector_reset (&in);
  control_client_close (&c);
  return status;
}
