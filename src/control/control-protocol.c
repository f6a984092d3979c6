/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: parsing control requests (see control-protocol.h).  Everything
 * a client sends goes through here first, so it checks every key against
 * the command table and rejects anything unexpected with a message.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control-protocol.h"

/* "name, cow, store" - the keys cmd takes, for error messages. */
static void
list_keys (enum control_cmd cmd, char *buf, size_t len)
{
  size_t used = 0;

  buf[0] = '\0';
  for (size_t i = 0; i < control_nargs && used < len; ++i) {
    const struct control_arg *a = &control_args[i];
    int n;

    if (a->cmd != cmd || (a->flags & CONTROL_ARG_LOCAL))
      continue;
    n = snprintf (buf + used, len - used, "%s%s", used ? ", " : "", a->key);
    if (n < 0)
      break;
    used += n;
  }
}

static int
check_value (const struct control_arg *a, json_t *v, char *err,
             size_t err_len)
{
  switch (a->type) {
  case CONTROL_TYPE_STRING:
  case CONTROL_TYPE_NAME:
  case CONTROL_TYPE_PATH:
    if (!json_is_string (v) || json_string_length (v) == 0) {
      snprintf (err, err_len, "\"%s\" must be a non-empty string", a->key);
      return -1;
    }
    return 0;
  case CONTROL_TYPE_SIZE:
    if (!json_is_integer (v) || json_integer_value (v) <= 0) {
      snprintf (err, err_len, "\"%s\" must be a positive integer (bytes)",
                a->key);
      return -1;
    }
    return 0;
  case CONTROL_TYPE_BOOL:
    if (!json_is_boolean (v)) {
      snprintf (err, err_len, "\"%s\" must be true or false", a->key);
      return -1;
    }
    return 0;
  }
  snprintf (err, err_len, "\"%s\": unknown type in the command table",
            a->key);
  return -1;
}

static int
check_request (json_t *obj, struct control_request *req, char *err,
               size_t err_len)
{
  json_t *cmd = json_object_get (obj, "cmd");
  const struct control_command *c;
  const char *key;
  json_t *v;

  if (cmd == NULL) {
    snprintf (err, err_len, "missing \"cmd\" (a string)");
    return -1;
  }
  if (!json_is_string (cmd)) {
    snprintf (err, err_len, "\"cmd\" must be a string (the command)");
    return -1;
  }
  c = control_command_find (json_string_value (cmd));
  if (c == NULL) {
    snprintf (err, err_len, "unknown command \"%.64s\" (see snapfgctl help)",
              json_string_value (cmd));
    return -1;
  }

  json_object_foreach (obj, key, v) {
    const struct control_arg *a;

    if (strcmp (key, "cmd") == 0)
      continue;
    a = control_arg_find (c->cmd, key);
    if (a == NULL || (a->flags & CONTROL_ARG_LOCAL)) {
      char keys[256];
      list_keys (c->cmd, keys, sizeof keys);
      snprintf (err, err_len, "unexpected \"%.64s\" for command %s (%s%s)",
                key, c->name, keys[0] ? "it takes: " : "it takes no "
                "arguments", keys);
      return -1;
    }
    if (check_value (a, v, err, err_len) < 0)
      return -1;
  }
  for (size_t i = 0; i < control_nargs; ++i) {
    const struct control_arg *a = &control_args[i];

    if (a->cmd == c->cmd && (a->flags & CONTROL_ARG_REQUIRED) &&
        json_object_get (obj, a->key) == NULL) {
      snprintf (err, err_len, "missing \"%s\" for command %s", a->key,
                c->name);
      return -1;
    }
  }
  req->command = c;
  return 0;
}

int
control_parse_request (const char *line, size_t len,
                       struct control_request *req, char *err,
                       size_t err_len)
{
  json_error_t jerr;
  json_t *obj;

  memset (req, 0, sizeof *req);
  if (len > CONTROL_MAX_LINE) {
    snprintf (err, err_len, "request longer than %d bytes", CONTROL_MAX_LINE);
    return -1;
  }
  if (memchr (line, '\0', len)) {
    snprintf (err, err_len, "NUL byte in request");
    return -1;
  }
  /* JSON_DECODE_ANY: a string or number is answered with "must be an
   * object" below rather than with jansson's less helpful message.
   */
  obj = json_loadb (line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
                    &jerr);
  if (obj == NULL) {
    snprintf (err, err_len, "not a JSON request: %.150s (at byte %d)",
              jerr.text, jerr.position);
    return -1;
  }
  if (!json_is_object (obj)) {
    snprintf (err, err_len, "a request must be a JSON object, "
              "e.g. {\"cmd\":\"status\"}");
    json_decref (obj);
    return -1;
  }
  if (check_request (obj, req, err, err_len) < 0) {
    json_decref (obj);
    memset (req, 0, sizeof *req);
    return -1;
  }
  req->json = obj;
  return 0;
}

void
control_request_free (struct control_request *req)
{
  json_decref (req->json);
  memset (req, 0, sizeof *req);
}

const char *
control_arg_string (const struct control_request *req, const char *key)
{
  return json_string_value (json_object_get (req->json, key));
}

uint64_t
control_arg_size (const struct control_request *req, const char *key)
{
  json_t *v = json_object_get (req->json, key);

  return json_is_integer (v) ? (uint64_t) json_integer_value (v) : 0;
}

bool
control_arg_bool (const struct control_request *req, const char *key)
{
  return json_is_true (json_object_get (req->json, key));
}
