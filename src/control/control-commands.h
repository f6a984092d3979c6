/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the control commands, generated from control-commands.def.
 *
 * The server (control-protocol.c, control-handlers.c), snapfgctl and
 * the tests all read the same table; see control-commands.def for how
 * to add a command or a key.
 */
#ifndef SNAPFG_CONTROL_COMMANDS_H
#define SNAPFG_CONTROL_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>

#include "store-types.h"            /* the create command's store choices */

enum control_cmd {
#define CONTROL_COMMAND(id, name, handler, flags, summary) CONTROL_##id,
#define CONTROL_ARG(cmd, key, type, flags, option, metavar, help)
#include "control-commands.def"
#undef CONTROL_COMMAND
#undef CONTROL_ARG
  CONTROL_NCOMMANDS
};

/* Command flags. */
#define CONTROL_CMD_ACTION 1u  /* changes state: logged with who asked */
/* snapfgctl spells it as two words, the part before the first '-' and
 * the rest ("checkpoint create" for "checkpoint-create"); the hyphenated
 * name works too.
 */
#define CONTROL_CMD_TWO_WORDS 2u

enum control_arg_type {
  CONTROL_TYPE_STRING,
  CONTROL_TYPE_NAME,
  CONTROL_TYPE_PATH,
  CONTROL_TYPE_SIZE,
  CONTROL_TYPE_BOOL,
};

/* Argument flags. */
#define CONTROL_ARG_REQUIRED   1u
#define CONTROL_ARG_POSITIONAL 2u
#define CONTROL_ARG_LOCAL      4u  /* snapfgctl's own; never sent */

struct control_command {
  enum control_cmd cmd;
  const char *name;
  unsigned flags;
  const char *summary;
};

struct control_arg {
  enum control_cmd cmd;         /* the command it belongs to */
  const char *key;
  enum control_arg_type type;
  unsigned flags;
  const char *option;           /* snapfgctl's --option; NULL: positional */
  const char *metavar;
  const char *help;
};

/* Indexed by enum control_cmd. */
extern const struct control_command control_commands[CONTROL_NCOMMANDS];
/* Every argument of every command, in table order. */
extern const struct control_arg control_args[];
extern const size_t control_nargs;

/* The command called name (NULL if none). */
extern const struct control_command *control_command_find (const char *name);
/* The argument key of command cmd (NULL if it has none). */
extern const struct control_arg *control_arg_find (enum control_cmd cmd,
                                                   const char *key);

#endif
