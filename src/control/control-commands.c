/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the control command table (see control-commands.def). */

#include <config.h>

#include <string.h>

#include "control-commands.h"

const struct control_command control_commands[CONTROL_NCOMMANDS] = {
#define CONTROL_COMMAND(id, name, handler, flags, summary) \
  [CONTROL_##id] = { CONTROL_##id, name, flags, summary },
#define CONTROL_ARG(cmd, key, type, flags, option, metavar, help)
#include "control-commands.def"
#undef CONTROL_COMMAND
#undef CONTROL_ARG
};

const struct control_arg control_args[] = {
#define CONTROL_COMMAND(id, name, handler, flags, summary)
#define CONTROL_ARG(cmd, key, type, flags, option, metavar, help) \
  { CONTROL_##cmd, key, CONTROL_TYPE_##type, flags, option, metavar, help },
#include "control-commands.def"
#undef CONTROL_COMMAND
#undef CONTROL_ARG
};

const size_t control_nargs = sizeof control_args / sizeof control_args[0];

const struct control_command *
control_command_find (const char *name)
{
  for (size_t i = 0; i < CONTROL_NCOMMANDS; ++i)
    if (strcmp (control_commands[i].name, name) == 0)
      return &control_commands[i];
  return NULL;
}

const struct control_arg *
control_arg_find (enum control_cmd cmd, const char *key)
{
  for (size_t i = 0; i < control_nargs; ++i)
    if (control_args[i].cmd == cmd && strcmp (control_args[i].key, key) == 0)
      return &control_args[i];
  return NULL;
}
