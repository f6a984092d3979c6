/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* libFuzzer target for the control protocol's request parser.
 *
 * Every byte a control client sends reaches control_parse_request (and
 * through it jansson) first, so it must cope with anything: it either
 * fills in a request, which must then be consistent with the command
 * table, or refuses with a message.  Built and run by
 * tests/test-fuzz-control.sh:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I$top_srcdir/src \
 *     -I$top_builddir tests/fuzz-control-protocol.c src/control-protocol.c \
 *     src/control-commands.c $(pkg-config --cflags --libs jansson)
 *
 * Besides crashes, leaks and undefined behaviour (the sanitizers), it
 * checks what the parser promises: an error always comes with a
 * non-empty, NUL-terminated message that fits the buffer and leaves the
 * request empty; a request that parses names a command of the table,
 * has every argument the table requires, only arguments the table lists
 * for it (never snapfgctl's local ones), each of its type (non-empty
 * strings, positive sizes, booleans); anything longer than
 * CONTROL_MAX_LINE or with a NUL is refused; and freeing leaves the
 * request zeroed.
 */

#include <config.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control-protocol.h"

static void
check (int cond, const char *what)
{
  if (!cond) {
    fprintf (stderr, "fuzz-control-protocol: broken promise: %s\n", what);
    abort ();
  }
}

static void
check_args (const struct control_request *req)
{
  enum control_cmd cmd = req->command->cmd;
  const char *key;
  json_t *v;

  check (req->command == &control_commands[cmd], "command not from the table");
  json_object_foreach (req->json, key, v) {
    const struct control_arg *a;

    if (strcmp (key, "cmd") == 0) {
      check (json_is_string (v) &&
             strcmp (json_string_value (v), req->command->name) == 0,
             "cmd is not the command's name");
      continue;
    }
    a = control_arg_find (cmd, key);
    check (a != NULL, "a key the table does not list was accepted");
    check (!(a->flags & CONTROL_ARG_LOCAL), "a local option was accepted");
    switch (a->type) {
    case CONTROL_TYPE_STRING:
    case CONTROL_TYPE_NAME:
    case CONTROL_TYPE_PATH:
      check (json_is_string (v) && json_string_length (v) > 0 &&
             strlen (control_arg_string (req, key)) == json_string_length (v),
             "a string argument that is not a non-empty string without NUL");
      break;
    case CONTROL_TYPE_SIZE:
      check (json_is_integer (v) && json_integer_value (v) > 0 &&
             control_arg_size (req, key) == (uint64_t) json_integer_value (v),
             "a size that is not a positive integer");
      break;
    case CONTROL_TYPE_BOOL:
      check (json_is_boolean (v), "a boolean that is not true or false");
      break;
    default:
      check (0, "an argument of unknown type");
    }
  }
  for (size_t i = 0; i < control_nargs; ++i)
    if (control_args[i].cmd == cmd &&
        (control_args[i].flags & CONTROL_ARG_REQUIRED))
      check (json_object_get (req->json, control_args[i].key) != NULL,
             "a required argument is missing");
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct control_request req;
  /* An error buffer with guard bytes after it: the message must fit. */
  char err[256 + 16];
  int r;

  memset (err, 'G', sizeof err);
  memset (&req, 0xa5, sizeof req);
  r = control_parse_request ((const char *) data, size, &req, err, 256);
  for (size_t i = 256; i < sizeof err; ++i)
    check (err[i] == 'G', "the error message overran its buffer");

  if (r < 0) {
    check (r == -1, "control_parse_request returned neither 0 nor -1");
    check (memchr (err, '\0', 256) != NULL, "error message not terminated");
    check (err[0] != '\0', "error without a message");
    /* A refused request must hold nothing to free. */
    check (req.command == NULL && req.json == NULL,
           "a refused request still holds something");
    return 0;
  }

  check (r == 0, "control_parse_request returned neither 0 nor -1");
  check (size <= CONTROL_MAX_LINE, "a line over CONTROL_MAX_LINE was accepted");
  check (memchr (data, '\0', size) == NULL, "a line with a NUL was accepted");
  check (req.command != NULL && json_is_object (req.json),
         "an accepted request without command or object");
  check_args (&req);

  control_request_free (&req);
  check (req.command == NULL && req.json == NULL,
         "control_request_free left pointers behind");
  return 0;
}
