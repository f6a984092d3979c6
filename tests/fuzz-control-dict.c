/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Print the libFuzzer dictionary for the control protocol, generated
 * from the command table (control-commands.def), so that a new command
 * or key is fuzzed without anyone remembering to add it: JSON's own
 * tokens, then every command name and every key, quoted as they appear
 * in a request.  Built and run by tests/test-fuzz-control.sh.
 */

#include <config.h>

#include <stdio.h>

#include "control-commands.h"

static void
token (const char *s)
{
  /* A dictionary entry is a C-like string: "\"name\"" */
  printf ("\"\\\"%s\\\"\"\n", s);
}

int
main (void)
{
  static const char *const json_tokens[] = {
    "{", "}", "[", "]", ":", ",", "\\\"", "\\\\u", "\\\\ud800", "true",
    "false", "null", "-0", "1e400", "9223372036854775807",
    "9223372036854775808",
  };

  for (size_t i = 0; i < sizeof json_tokens / sizeof json_tokens[0]; ++i)
    printf ("\"%s\"\n", json_tokens[i]);
  token ("cmd");
  for (size_t i = 0; i < CONTROL_NCOMMANDS; ++i)
    token (control_commands[i].name);
  for (size_t i = 0; i < control_nargs; ++i)
    token (control_args[i].key);
  token ("persistent");
  token ("transient");
  return 0;
}
