/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: control requests through the run's session.
 *
 * The connection is the control client both tools share
 * (tools/common/control-client.c): the control socket itself, or
 * snapfgctl --stdio on the server at the other end of ssh (-H).  One
 * connection serves the whole run, so that over SSH every request goes
 * through the one authenticated connection.  Requests are made with
 * control_request and control_request_set (the command table).
 */

#include <config.h>

#include <stdio.h>
#include <string.h>

#include "snapfg-backup.h"

int
control_send (const struct backup_options *o, json_t *req, char *err,
              size_t err_len)
{
  struct control_client *c = &o->session->ctl;

  if (control_client_send (c, req) == -1) {
    snprintf (err, err_len, "%s", c->error);
    return -1;
  }
  return 0;
}

json_t *
control_receive (const struct backup_options *o, const char *cmd, char *err,
                 size_t err_len)
{
  struct control_client *c = &o->session->ctl;
  json_t *reply = control_client_receive (c, cmd, NULL);

  if (reply == NULL) {
    snprintf (err, err_len, "%s", c->error);
    return NULL;
  }
  if (!json_is_true (json_object_get (reply, "ok"))) {
    snprintf (err, err_len, "%s", control_reply_error (reply));
    json_decref (reply);
    return NULL;
  }
  return reply;
}

json_t *
control_call (const struct backup_options *o, json_t *req, char *err,
              size_t err_len)
{
  if (control_send (o, req, err, err_len) == -1)
    return NULL;
  return control_receive (o, json_string_value (json_object_get (req, "cmd")),
                          err, err_len);
}

int
control_failure_status (const struct backup_options *o)
{
  const struct control_client *c = &o->session->ctl;

  return c->result == CONTROL_REPLIED ? EXIT_FAILED
    : control_client_exit_status (c);
}
