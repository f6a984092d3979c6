/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Generated from the command table (control-commands.def), so that a new
 * command or key is fuzzed without anyone remembering to add it:
 *
 *   fuzz-control-dict          print the libFuzzer dictionary: JSON's own
 *                              tokens, then every command name, every key
 *                              and every store type, quoted as they
 *                              appear in a request
 *   fuzz-control-dict seeds DIR
 *                              write seed requests into DIR, two per
 *                              command (cmd-NAME-required: only its
 *                              required keys; cmd-NAME-all: every key
 *                              the server takes), each a request with a
 *                              sample value of the key's type that the
 *                              protocol must accept (exit 1 if not)
 *
 * Built and run by tests/test-fuzz-control.sh.
 */

#include <config.h>

#include <stdio.h>
#include <string.h>

#include "control-commands.h"
#include "control-protocol.h"

static void
token (const char *s)
{
  /* A dictionary entry is a C-like string: "\"name\"" */
  printf ("\"\\\"%s\\\"\"\n", s);
}

/* A sample value of an argument's type, as JSON. */
static const char *
sample_value (const struct control_arg *a)
{
  switch (a->type) {
  case CONTROL_TYPE_NAME:   return "\"snap1\"";
  case CONTROL_TYPE_PATH:   return "\"/var/tmp/snap1.cow\"";
  case CONTROL_TYPE_SIZE:   return "4096";
  case CONTROL_TYPE_BOOL:   return "true";
  case CONTROL_TYPE_STRING: break;
  }
  if (strcmp (a->key, "store") == 0)
    return "\"" SNAPFG_DEFAULT_STORE_TYPE "\"";
  return "\"c1\"";
}

static int
write_seed (const char *dir, const struct control_command *c, bool all)
{
  char path[4096], line[4096], err[256];
  size_t len = 0;
  struct control_request req;
  FILE *fp;

  len += snprintf (line + len, sizeof line - len, "{\"cmd\":\"%s\"",
                   c->name);
  for (size_t i = 0; i < control_nargs; ++i) {
    const struct control_arg *a = &control_args[i];

    if (a->cmd != c->cmd || (a->flags & CONTROL_ARG_LOCAL))
      continue;
    if (all || (a->flags & CONTROL_ARG_REQUIRED))
      len += snprintf (line + len, sizeof line - len, ",\"%s\":%s", a->key,
                       sample_value (a));
  }
  len += snprintf (line + len, sizeof line - len, "}");
  if (len >= sizeof line) {
    fprintf (stderr, "fuzz-control-dict: the %s seed is too long\n", c->name);
    return -1;
  }
  /* The table and the protocol must agree that this is a request. */
  if (control_parse_request (line, len, &req, err, sizeof err) == -1) {
    fprintf (stderr, "fuzz-control-dict: the protocol refuses %s: %s\n",
             line, err);
    return -1;
  }
  control_request_free (&req);

  snprintf (path, sizeof path, "%s/cmd-%s-%s", dir, c->name,
            all ? "all" : "required");
  fp = fopen (path, "w");
  if (fp == NULL) {
    perror (path);
    return -1;
  }
  /* No newline: the server strips it before parsing. */
  fputs (line, fp);
  if (fclose (fp) == EOF) {
    perror (path);
    return -1;
  }
  return 0;
}

static int
write_seeds (const char *dir)
{
  for (size_t i = 0; i < CONTROL_NCOMMANDS; ++i)
    if (write_seed (dir, &control_commands[i], false) == -1 ||
        write_seed (dir, &control_commands[i], true) == -1)
      return 1;
  return 0;
}

#define STORE_TYPE_TOKEN(name, open, survives, summary) token (#name);

int
main (int argc, char *argv[])
{
  static const char *const json_tokens[] = {
    "{", "}", "[", "]", ":", ",", "\\\"", "\\\\u", "\\\\ud800", "true",
    "false", "null", "-0", "1e400", "9223372036854775807",
    "9223372036854775808",
  };

  if (argc == 3 && strcmp (argv[1], "seeds") == 0)
    return write_seeds (argv[2]);
  if (argc != 1) {
    fprintf (stderr, "usage: %s [seeds DIR]\n", argv[0]);
    return 2;
  }
  for (size_t i = 0; i < sizeof json_tokens / sizeof json_tokens[0]; ++i)
    printf ("\"%s\"\n", json_tokens[i]);
  token ("cmd");
  for (size_t i = 0; i < CONTROL_NCOMMANDS; ++i)
    token (control_commands[i].name);
  for (size_t i = 0; i < control_nargs; ++i)
    token (control_args[i].key);
  SNAPFG_STORE_TYPES (STORE_TYPE_TOKEN)
  return 0;
}
