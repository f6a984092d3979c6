/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the control dispatcher (see control-handlers.h).
 *
 * control_execute runs one request's handler from the command table and
 * makes the reply line.  A refusal's message is the handler's own
 * (call->error), else the one the engine recorded where it failed
 * (snapfg-error.h), else the errno's text; the log gets who asked, as
 * an error or as a debug message depending on whose trouble it was.
 * The handlers themselves are in control-handlers.c.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>

#include "control-handlers.h"
#include "snapfg-log.h"
#include "snapfg-error.h"



/* --- reply lines --- */

char *
control_dump_line (json_t *obj)
{
  char *s = json_dumps (obj, JSON_COMPACT | JSON_REAL_PRECISION (15));
  size_t len;
  char *line;

  if (s == NULL)
    return NULL;
  len = strlen (s);
  line = realloc (s, len + 2);
  if (line == NULL) {
    free (s);
    return NULL;
  }
  line[len] = '\n';
  line[len + 1] = '\0';
  return line;
}

char *
control_error_reply (const char *msg)
{
  json_t *obj = json_object ();
  char *line;

  if (obj == NULL)
    return NULL;
  json_object_set_new (obj, "ok", json_false ());
  json_object_set_new (obj, "error", control_json_text (msg));
  line = control_dump_line (obj);
  json_decref (obj);
  return line;
}

/* --- the dispatcher --- */

static control_handler *const handlers[CONTROL_NCOMMANDS] = {
#define CONTROL_COMMAND(id, name, handler, flags, summary) \
  [CONTROL_##id] = handler,
#define CONTROL_ARG(cmd, key, type, flags, option, metavar, help)
#include "control-commands.def"
#undef CONTROL_COMMAND
#undef CONTROL_ARG
};

/* Log a refused request once, with who asked.  A refusal of what was
 * asked is the client's business: a debug message with the reply's
 * text (the client has the reply).  The server's trouble is an error;
 * when the engine already logged its message as an error where it
 * failed (snapfg_fail), with the details, this line adds only who asked
 * and the errno, so that the log does not hold the same long message
 * twice; otherwise (the handler's own message, or one the engine only
 * recorded) the message goes with it.
 */
static void
log_refusal (const char *who, const char *command, const char *asked,
             int err, const char *msg, bool engine_logged)
{
  if (!snapfg_is_server_trouble (err))
    snapfg_debug ("%s%s: %s: refused: %s", who, command, asked, msg);
  else if (engine_logged)
    snapfg_error ("%s%s: %s: failed: %s (the error above)", who, command,
                  asked, strerror (err));
  else
    snapfg_error ("%s%s: %s: failed: %s", who, command, asked, msg);
}

char *
control_execute (struct snapfg_engine *e, const struct control_request *req,
                 const struct control_peer *peer)
{
  struct control_call call = {
    .e = e, .req = req, .peer = peer,
  };
  bool action = req->command->flags & CONTROL_CMD_ACTION;
  bool engine_logged = false;
  char who[160], *asked, *line;
  int r;

  call.reply = json_object ();
  if (call.reply == NULL)
    return NULL;
  json_object_set_new (call.reply, "ok", json_true ());
  /* Whatever failed before (another command, the start) is not this
   * command's message.
   */
  snapfg_clear_error ();
  r = handlers[req->command->cmd] (&call);
  if (r < 0 && call.error[0] == '\0') {
    const char *recorded = snapfg_get_error ();

    engine_logged = recorded && snapfg_error_logged ();
    snprintf (call.error, sizeof call.error, "%s",
              recorded ? recorded : strerror (-r));
  }

  /* Who asked what, for the log.  The request is printed as JSON, so a
   * name with odd characters cannot forge a log line.
   */
  asked = json_dumps (req->json, JSON_COMPACT);
  snprintf (who, sizeof who, "control: pid %d uid %d: ", (int) peer->pid,
            (int) peer->uid);
  if (r < 0) {
    log_refusal (who, req->command->name, asked ? asked : "?", -r,
                 call.error, engine_logged);
    line = control_error_reply (call.error);
    free (call.raw_reply);
  }
  else {
    if (action)
      snapfg_notice ("%s%s: %s: done", who, req->command->name,
                     asked ? asked : "?");
    line = call.raw_reply ? call.raw_reply : control_dump_line (call.reply);
  }
  free (asked);
  json_decref (call.reply);
  return line;
}
