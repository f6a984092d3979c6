/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the control protocol spoken over the control= socket.
 *
 * One JSON object per line each way.  A request names a command ("cmd")
 * and its arguments, as control-commands.def lists them; the reply has
 * "ok": true and the command's data, or "ok": false and "error": a
 * message.  See snapfgctl(1).
 *
 *   {"cmd":"status"}                     {"cmd":"status","name":"snap1"}
 *   {"cmd":"create","name":"snap1","cow":"/path","store":"persistent",
 *    "chunk_size":4096,"cow_size":1073741824}
 *   {"cmd":"drop","name":"snap1"}
 *
 * Parsing is jansson's (duplicate keys refused, UTF-8 checked, no NUL in
 * strings), then every key is checked against the command's entry in
 * the table: unknown keys, missing required ones and values of the
 * wrong type are refused with a message naming the key.
 */
#ifndef SNAPFG_CONTROL_PROTOCOL_H
#define SNAPFG_CONTROL_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "control-commands.h"

/* Requests longer than this (without the newline) are refused. */
#define CONTROL_MAX_LINE 4096

struct control_request {
  const struct control_command *command;
  json_t *json;                 /* the request object, checked */
};

/* Parse one request line (without its newline).  Returns 0, or -1 with
 * a message saying what is wrong in err (req is then empty).
 */
extern int control_parse_request (const char *line, size_t len,
                                  struct control_request *req,
                                  char *err, size_t err_len);
extern void control_request_free (struct control_request *req);

/* A checked request's arguments (absent: NULL, 0). */
extern const char *control_arg_string (const struct control_request *req,
                                       const char *key);
extern uint64_t control_arg_size (const struct control_request *req,
                                  const char *key);
extern bool control_arg_bool (const struct control_request *req,
                              const char *key);

#endif
