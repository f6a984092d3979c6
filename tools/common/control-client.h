/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* The control client of both tools (snapfgctl, snapfg-backup).
 *
 * One JSON object per line each way (snapfgctl(1), PROTOCOL), several
 * requests over one connection, each reply awaited for at most the
 * client's timeout.  The connection is either the control socket itself
 * or a command whose standard input and output lead to one (ssh HOST
 * snapfgctl --stdio, for snapfg-backup -H).
 *
 * Requests are made from the command table (control-commands.def):
 * control_request and control_request_set refuse, at once and loudly, a
 * command or a key the table does not have, so that a tool can never
 * send what the server does not know.
 */
#ifndef SNAPFG_CONTROL_CLIENT_H
#define SNAPFG_CONTROL_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <jansson.h>

#include "control-commands.h"
#include "vector.h"

/* How the last call ended. */
enum control_result {
  CONTROL_REPLIED,              /* a reply ("ok" true or false) */
  CONTROL_UNREACHABLE,          /* no connection, or it was lost */
  CONTROL_TIMEOUT,              /* no reply within the timeout */
  CONTROL_BAD_REPLY,            /* a reply that is not the protocol's */
};

struct control_client {
  char *what;                   /* "the control socket S", for messages */
  int rfd, wfd;                 /* the same socket, or the command's pipes */
  pid_t pid;                    /* the command's, or -1 */
  int timeout_ms;               /* per reply; <= 0: none */
  char_vector buf;              /* received, not yet returned */
  enum control_result result;   /* of the last call */
  char error[1024];             /* what went wrong, for the caller */
};

/* Connect to the control socket PATH.  0, or -1 with client->error set
 * (client->result CONTROL_UNREACHABLE).  TIMEOUT_S: seconds for each
 * reply, 0 for none.
 */
extern int control_client_connect (struct control_client *c,
                                   const char *path, int timeout_s);
/* Run ARGV (no shell) with its standard input and output as the
 * connection; its standard error is ours.  It runs in its own process
 * group (a terminal's ^C reaches only us, so that we can still clean up
 * through it) and gets SIGTERM when we die.  WHAT names it in messages.
 */
extern int control_client_spawn (struct control_client *c, char *const argv[],
                                 const char *what, int timeout_s);
/* Close the connection and, for a command, wait for it to exit (at most
 * a few seconds, then SIGTERM).  Safe on a client that never opened.
 */
extern void control_client_close (struct control_client *c);

/* Send REQ (not consumed) and read its reply.  Returns the reply,
 * whether it says "ok": true or false (and the line, without its
 * newline, in *line if LINE is not NULL, malloc'd); NULL when there is
 * none, with c->result and c->error saying why.
 */
extern json_t *control_client_call (struct control_client *c, json_t *req,
                                    char **line);
/* control_client_call in two halves, so that the caller can work while
 * the server does (a request's reply is read before the next request is
 * sent: the server answers in order).  Send REQ (not consumed): 0, or -1
 * with c->result and c->error set.  Then read the reply to the request
 * CMD names (for messages), as control_client_call returns it.
 */
extern int control_client_send (struct control_client *c, json_t *req);
extern json_t *control_client_receive (struct control_client *c,
                                       const char *cmd, char **line);
/* A refusal's message. */
extern const char *control_reply_error (json_t *reply);
/* The tool exit status (tool-exit.h) for a call that got no reply. */
extern int control_client_exit_status (const struct control_client *c);

/* A new request {"cmd": NAME} for command CMD. */
extern json_t *control_request (enum control_cmd cmd);
/* Set KEY in REQ.  KEY must be one of REQ's command's keys in the table
 * and not a local one, VALUE of its type (a string for STRING, NAME and
 * PATH, an integer for SIZE, a boolean for BOOL): otherwise this is a
 * bug in the tool, and it aborts.  VALUE is consumed; NULL leaves KEY
 * out.
 */
extern void control_request_set (json_t *req, const char *key, json_t *value);
static inline void
control_request_set_string (json_t *req, const char *key, const char *value)
{
  if (value)
    control_request_set (req, key, json_string (value));
}

#endif
