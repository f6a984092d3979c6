/* snapfg: parsing control requests (see control-protocol.h).  Everything
 * a client sends goes through here first, so it checks every field and
 * rejects anything unexpected with a message.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>

#include "control-protocol.h"
#include "json.h"

static const struct {
  const char *name;
  enum control_cmd cmd;
} commands[] = {
  { "status", CONTROL_STATUS },
  { "list", CONTROL_LIST },
  { "create", CONTROL_CREATE },
  { "drop", CONTROL_DROP },
  { "set-block-size", CONTROL_SET_BLOCK_SIZE },
  { "merge", CONTROL_MERGE },
  { "changed", CONTROL_CHANGED },
  { "stats", CONTROL_STATS },
  { "checkpoint-create", CONTROL_CHECKPOINT_CREATE },
  { "checkpoint-list", CONTROL_CHECKPOINT_LIST },
  { "checkpoint-drop", CONTROL_CHECKPOINT_DROP },
};

/* Which keys each command accepts besides "cmd". */
static bool
key_allowed (enum control_cmd cmd, const char *key)
{
  switch (cmd) {
  case CONTROL_STATUS:
    return strcmp (key, "name") == 0;
  case CONTROL_LIST:
  case CONTROL_STATS:
  case CONTROL_CHECKPOINT_LIST:
    return false;
  case CONTROL_CREATE:
    return strcmp (key, "name") == 0 || strcmp (key, "cow") == 0 ||
      strcmp (key, "store") == 0 || strcmp (key, "chunk_size") == 0 ||
      strcmp (key, "cow_size") == 0 || strcmp (key, "checkpoint") == 0;
  case CONTROL_CHANGED:
    return strcmp (key, "name") == 0 || strcmp (key, "since") == 0;
  case CONTROL_DROP:
  case CONTROL_MERGE:
  case CONTROL_CHECKPOINT_CREATE:
  case CONTROL_CHECKPOINT_DROP:
    return strcmp (key, "name") == 0;
  case CONTROL_SET_BLOCK_SIZE:
    return strcmp (key, "block_size") == 0;
  }
  return false;
}

static int
get_string (const struct json_value *obj, const char *key, bool required,
            char **out, char *err, size_t err_len)
{
  const struct json_value *v = json_get (obj, key);

  if (v == NULL) {
    if (required) {
      snprintf (err, err_len, "missing \"%s\"", key);
      return -1;
    }
    return 0;
  }
  if (v->type != JSON_STRING || v->string[0] == '\0') {
    snprintf (err, err_len, "\"%s\" must be a non-empty string", key);
    return -1;
  }
  *out = strdup (v->string);
  if (*out == NULL) {
    snprintf (err, err_len, "out of memory");
    return -1;
  }
  return 0;
}

static int
get_size (const struct json_value *obj, const char *key, bool required,
          uint64_t *out, char *err, size_t err_len)
{
  const struct json_value *v = json_get (obj, key);

  if (v == NULL) {
    if (required) {
      snprintf (err, err_len, "missing \"%s\"", key);
      return -1;
    }
    return 0;
  }
  if (v->type != JSON_NUMBER || !v->is_integer || v->integer <= 0) {
    snprintf (err, err_len, "\"%s\" must be a positive integer (bytes)",
              key);
    return -1;
  }
  *out = v->integer;
  return 0;
}

int
control_parse_request (const char *line, size_t len,
                       struct control_request *req, char *err,
                       size_t err_len)
{
  struct json_value *v;
  const char *cmd;
  bool found = false;
  bool required_name;
  int r = -1;

  memset (req, 0, sizeof *req);
  if (len > CONTROL_MAX_LINE) {
    snprintf (err, err_len, "request longer than %d bytes", CONTROL_MAX_LINE);
    return -1;
  }
  if (memchr (line, '\0', len)) {
    snprintf (err, err_len, "NUL byte in request");
    return -1;
  }
  v = json_parse (line, len, err, err_len);
  if (v == NULL) {
    char why[128];
    snprintf (why, sizeof why, "%s", err);
    snprintf (err, err_len, "not a JSON request: %s", why);
    return -1;
  }
  if (v->type != JSON_OBJECT) {
    snprintf (err, err_len, "a request must be a JSON object");
    goto out;
  }
  cmd = json_get_string (v, "cmd");
  if (cmd == NULL) {
    snprintf (err, err_len, "missing \"cmd\" (a string)");
    goto out;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; ++i) {
    if (strcmp (cmd, commands[i].name) == 0) {
      req->cmd = commands[i].cmd;
      found = true;
    }
  }
  if (!found) {
    snprintf (err, err_len, "unknown command \"%.64s\"", cmd);
    goto out;
  }
  for (size_t i = 0; i < v->count; ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (strcmp (v->keys[i], v->keys[j]) == 0) {
        snprintf (err, err_len, "\"%.64s\" given twice", v->keys[i]);
        goto out;
      }
    }
    if (strcmp (v->keys[i], "cmd") != 0 && !key_allowed (req->cmd, v->keys[i])) {
      snprintf (err, err_len, "unexpected \"%.64s\" for command %s",
                v->keys[i], cmd);
      goto out;
    }
  }

  required_name = req->cmd == CONTROL_CREATE || req->cmd == CONTROL_DROP ||
    req->cmd == CONTROL_MERGE ||
    (req->cmd == CONTROL_CHANGED && json_get (v, "since") == NULL) ||
    req->cmd == CONTROL_CHECKPOINT_CREATE ||
    req->cmd == CONTROL_CHECKPOINT_DROP;
  if (get_string (v, "name", required_name, &req->name, err, err_len) < 0 ||
      get_string (v, "cow", false, &req->cow,
                  err, err_len) < 0 ||
      get_string (v, "store", false, &req->store, err, err_len) < 0 ||
      get_string (v, "checkpoint", false, &req->checkpoint, err,
                  err_len) < 0 ||
      get_string (v, "since", false, &req->since, err, err_len) < 0 ||
      get_size (v, "chunk_size", false, &req->chunk_size, err, err_len) < 0 ||
      get_size (v, "cow_size", false, &req->cow_size, err, err_len) < 0 ||
      get_size (v, "block_size", req->cmd == CONTROL_SET_BLOCK_SIZE,
                &req->block_size, err, err_len) < 0)
    goto out;
  r = 0;

 out:
  json_free (v);
  if (r < 0)
    control_request_free (req);
  return r;
}

void
control_request_free (struct control_request *req)
{
  free (req->name);
  free (req->cow);
  free (req->store);
  free (req->checkpoint);
  free (req->since);
  memset (req, 0, sizeof *req);
}
