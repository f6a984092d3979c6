/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl: its usage texts, all made from the command table
 * (control-commands.def): the list of commands, one command's synopsis
 * and --help, and how the command line's words name a command.
 */

#include <config.h>

#include <stdio.h>
#include <string.h>

#include "control-commands.h"
#include "snapfgctl.h"

/* The command as snapfgctl spells it ("checkpoint create"). */
const char *
cli_name (const struct control_command *c)
{
  static char buf[64];
  const char *dash = strchr (c->name, '-');

  if (!(c->flags & CONTROL_CMD_TWO_WORDS) || dash == NULL)
    return c->name;
  snprintf (buf, sizeof buf, "%.*s %s", (int) (dash - c->name), c->name,
            dash + 1);
  return buf;
}

/* The command named by the first one or two words (NULL: none). */
const struct control_command *
find_command (char **words, size_t nwords, size_t *used)
{
  const struct control_command *c = NULL;
  char joined[128];

  *used = 1;
  if (nwords >= 2) {
    snprintf (joined, sizeof joined, "%s-%s", words[0], words[1]);
    c = control_command_find (joined);
    if (c && (c->flags & CONTROL_CMD_TWO_WORDS)) {
      *used = 2;
      return c;
    }
  }
  return control_command_find (words[0]);
}

/* "create NAME --cow PATH [--store persistent|transient] ..." */
void
print_synopsis (FILE *fp, const struct control_command *c)
{
  fprintf (fp, "%s", cli_name (c));
  for (size_t i = 0; i < control_nargs; ++i) {
    const struct control_arg *a = &control_args[i];
    bool required = a->flags & CONTROL_ARG_REQUIRED;

    if (a->cmd != c->cmd)
      continue;
    if (a->flags & CONTROL_ARG_POSITIONAL)
      fprintf (fp, required ? " %s" : " [%s]", a->metavar);
    else if (a->type == CONTROL_TYPE_BOOL)
      fprintf (fp, " [--%s]", a->option);
    else
      fprintf (fp, required ? " --%s %s" : " [--%s %s]", a->option,
               a->metavar);
  }
}

void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: snapfgctl -S SOCKET [--json] COMMAND [ARGS] [OPTIONS]\n"
           "       snapfgctl [--json] inspect [--exceptions] COW\n"
           "       snapfgctl help [COMMAND] | COMMAND --help | --version\n"
           "\n"
           "Commands for a running server (nbdkit snapfg ... "
           "control=SOCKET):\n");
  for (size_t i = 0; i < CONTROL_NCOMMANDS; ++i) {
    fprintf (fp, "  %-20s %s\n", cli_name (&control_commands[i]),
             control_commands[i].summary);
  }
  fprintf (fp,
           "Other commands:\n"
           "  %-20s %s\n"
           "  %-20s %s\n"
           "\n"
           "Options (anywhere on the line):\n"
           "  -S, --socket=SOCKET  the server's control socket\n"
           "  --json               print JSON (the server's reply)\n"
           "  --timeout=SECONDS    wait this long for each reply (default 60,\n"
           "                       0: no limit)\n"
           "  --progress=auto|always|never  merge --wait's progress\n"
           "  --stdio [--drop-on-hangup]  the socket on stdin/stdout (for ssh)\n"
           "  -h, --help           this help, or a command's\n"
           "  -V, --version        print the version\n"
           "\n"
           "Sizes take nbdkit's suffixes: b, s (512-byte sectors), k, m, g, "
           "t, p, e\n(powers of 1024, either case).\n"
           "Exit status: 0 done, 1 refused by the server (or a bad store), "
           "2 usage error,\n4 the server cannot be reached, 5 no reply "
           "within --timeout.  See snapfgctl(1).\n",
           "inspect", "print the header and usage of a COW store (read only)",
           "help", "this help, or one command's");
}

void
command_help (FILE *fp, const struct control_command *c)
{
  fprintf (fp, "usage: snapfgctl -S SOCKET [--json] ");
  print_synopsis (fp, c);
  fprintf (fp, "\n\n%s.\n", c->summary);
  for (size_t i = 0; i < control_nargs; ++i) {
    const struct control_arg *a = &control_args[i];
    char left[64];

    if (a->cmd != c->cmd)
      continue;
    if (a->flags & CONTROL_ARG_POSITIONAL)
      snprintf (left, sizeof left, "%s", a->metavar);
    else if (a->type == CONTROL_TYPE_BOOL)
      snprintf (left, sizeof left, "--%s", a->option);
    else
      snprintf (left, sizeof left, "--%s %s", a->option, a->metavar);
    fprintf (fp, "  %-26s %s\n", left, a->help);
  }
}

void
inspect_help (FILE *fp)
{
  fprintf (fp, "usage: snapfgctl [--json] inspect [--exceptions] COW\n\n"
           "Print the header and usage of a COW store (dm-snapshot's "
           "persistent format);\nread only, needs no server.\n"
           "  %-26s %s\n", "-e, --exceptions",
           "also print every exception: old_chunk new_chunk");
}

void
help_help (FILE *fp)
{
  fprintf (fp, "usage: snapfgctl help [COMMAND]\n\n"
           "The list of commands, or one command's usage (the same as "
           "COMMAND --help).\n");
}
