/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the control dispatcher (see control-handlers.h).
 *
 * control_execute runs one request's handler from the command table,
 * captures what the engine logs meanwhile (the reply carries the last
 * message; the log gets them all, with who asked, as errors or as debug
 * messages depending on whose trouble it was), and makes the reply line.
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



/* --- capturing the engine's errors --- */

/* Engine errors logged while a command runs on the control thread, one
 * per line; the reply carries the last one.  They are logged once the
 * outcome is known (see control_execute).  Only the control thread
 * writes these (the hook is installed on it alone), so they need not be
 * thread-local, which in a dlopened plugin would cost static TLS space.
 */
static char captured[2048];
static size_t captured_len;
static char last_error[512];

static void
capture_error (const char *fmt, va_list args)
{
  int n;

  vsnprintf (last_error, sizeof last_error, fmt, args);
  n = snprintf (captured + captured_len, sizeof captured - captured_len,
                "%s\n", last_error);
  if (n > 0)
    captured_len += (size_t) n < sizeof captured - captured_len
      ? (size_t) n : sizeof captured - captured_len - 1;
}

void
control_handlers_thread_init (void)
{
  snapfg_set_thread_error_hook (capture_error);
}

/* Did the request cause this error (a debug message), or is it the
 * server's trouble (an error in the log)?
 */
static bool
is_server_trouble (int err)
{
  switch (err) {
  case EIO: case ENOMEM: case ENOSPC: case EDQUOT: case EROFS: case EFBIG:
  case ENXIO: case ENODEV:
    return true;
  default:
    return false;
  }
}

/* snapfg_error on this thread would come back to capture_error. */
void
control_log_error (const char *fmt, ...)
{
  char msg[1024];
  va_list args;

  va_start (args, fmt);
  vsnprintf (msg, sizeof msg, fmt, args);
  va_end (args);
  snapfg_set_thread_error_hook (NULL);
  snapfg_error ("%s", msg);
  snapfg_set_thread_error_hook (capture_error);
}

static void
log_captured (bool as_error, const char *who)
{
  char *line = captured, *nl;

  while (line < captured + captured_len &&
         (nl = strchr (line, '\n')) != NULL) {
    *nl = '\0';
    if (as_error)
      control_log_error ("%s%s", who, line);
    else
      snapfg_debug ("%s%s", who, line);
    line = nl + 1;
  }
  captured_len = 0;
  captured[0] = '\0';
}

const char *
control_last_error (void)
{
  return last_error;
}

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

char *
control_execute (struct snapfg_engine *e, const struct control_request *req,
                 const struct control_peer *peer)
{
  struct control_call call = {
    .e = e, .req = req, .peer = peer,
  };
  bool action = req->command->flags & CONTROL_CMD_ACTION;
  char who[160], *asked, *line;
  int r;

  last_error[0] = '\0';
  captured_len = 0;
  captured[0] = '\0';
  call.reply = json_object ();
  if (call.reply == NULL)
    return NULL;
  json_object_set_new (call.reply, "ok", json_true ());
  r = handlers[req->command->cmd] (&call);
  if (r < 0 && call.error[0] == '\0')
    snprintf (call.error, sizeof call.error, "%s",
              last_error[0] ? last_error : strerror (-r));

  /* Who asked what, for the log.  The request is printed as JSON, so a
   * name with odd characters cannot forge a log line.
   */
  asked = json_dumps (req->json, JSON_COMPACT);
  snprintf (who, sizeof who, "control: pid %d uid %d: ", (int) peer->pid,
            (int) peer->uid);
  if (r < 0) {
    /* What the engine said (with the details), else the handler's own
     * message, logged with who asked.
     */
    bool trouble = is_server_trouble (-r);
    if (captured_len == 0) {
      snprintf (captured, sizeof captured, "%s\n", call.error);
      captured_len = strlen (captured);
    }
    log_captured (trouble, who);
    snapfg_debug ("%s%s: %s: refused", who, req->command->name,
                  asked ? asked : "?");
    line = control_error_reply (call.error);
    free (call.raw_reply);
  }
  else {
    log_captured (true, who);
    if (action)
      snapfg_notice ("%s%s: %s: done", who, req->command->name,
                     asked ? asked : "?");
    line = call.raw_reply ? call.raw_reply : control_dump_line (call.reply);
  }
  free (asked);
  json_decref (call.reply);
  return line;
}
