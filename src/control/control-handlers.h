/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the control commands' handlers (control-handlers.c) and their
 * dispatcher (control-dispatch.c).
 *
 * control-server.c reads request lines and hands each parsed request to
 * control_execute, which runs the command's handler (named in
 * control-commands.def) and returns the reply line.  A handler fills in
 * call->reply (a JSON object that will also get "ok": true), or writes
 * the whole reply line itself into call->raw_reply (for replies too big
 * to hold as a tree), or returns a negative errno with the message in
 * call->error, or leaves it empty when the engine call that failed
 * recorded its own message (snapfg-error.h), which the dispatcher then
 * puts in the reply.
 */
#ifndef SNAPFG_CONTROL_HANDLERS_H
#define SNAPFG_CONTROL_HANDLERS_H

#include <sys/types.h>

#include <jansson.h>

#include "engine.h"
#include "control-protocol.h"

/* Who sent the request (SO_PEERCRED of the control connection). */
struct control_peer {
  pid_t pid;
  uid_t uid;
};

struct control_call {
  struct snapfg_engine *e;
  const struct control_request *req;
  const struct control_peer *peer;
  json_t *reply;                /* "ok": true is already in it */
  char *raw_reply;              /* malloc'd, replaces reply if set */
  char error[512];
};

typedef int control_handler (struct control_call *call);

/* Every handler named in the table. */
#define CONTROL_COMMAND(id, name, handler, flags, summary) \
  extern control_handler handler;
#define CONTROL_ARG(cmd, key, type, flags, option, metavar, help)
#include "control-commands.def"
#undef CONTROL_COMMAND
#undef CONTROL_ARG

/* Run one request.  Returns its reply line, newline included (malloc'd;
 * NULL only when out of memory).  Actions are logged with the peer;
 * refusals caused by the request (no such snapshot, bad arguments) are
 * logged as debug messages, other failures as errors.
 */
extern char *control_execute (struct snapfg_engine *e,
                              const struct control_request *req,
                              const struct control_peer *peer);

/* {"ok":false,"error":msg} and a newline (malloc'd). */
extern char *control_error_reply (const char *msg);
/* OBJ as one compact reply line, newline included (malloc'd; NULL when
 * out of memory).
 */
extern char *control_dump_line (json_t *obj);
/* A JSON string for s, even if s is not UTF-8 (paths are bytes): its
 * non-UTF-8 bytes then become '?'.
 */
extern json_t *control_json_text (const char *s);

#endif
