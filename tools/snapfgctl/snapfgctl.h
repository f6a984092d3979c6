/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl: the parts shared by its source files.
 *
 *   snapfgctl.c             main: which command, running it, merge --wait
 *   snapfgctl-args.c        the command line and the request it makes
 *   snapfgctl-usage.c       usage and --help texts, from the table
 *   snapfgctl-stdio.c       --stdio: the control socket on stdin/stdout
 *   (the connection itself: tools/common/control-client.c, shared with
 *   snapfg-backup)
 *   snapfgctl-output.c      the human form of the replies
 *   snapfgctl-inspect.c     inspect: reading a COW store on disk
 *   snapfgctl-prometheus.c  stats --prometheus
 */
#ifndef SNAPFG_SNAPFGCTL_H
#define SNAPFG_SNAPFGCTL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "vector.h"

struct control_command;

#include "control-client.h"
#include "tool-exit.h"
#include "tool-output.h"

/* Exit statuses: the table both tools share (tool-exit.h, documented
 * in snapfgctl(1) and snapfg-backup(1)).
 */
#define EXIT_OK          TOOL_EXIT_OK
#define EXIT_REFUSED     TOOL_EXIT_FAILED  /* refused; inspect: bad store */
#define EXIT_USAGE       TOOL_EXIT_USAGE
#define EXIT_UNREACHABLE TOOL_EXIT_UNREACHABLE  /* no connection */
#define EXIT_TIMEOUT     TOOL_EXIT_TIMEOUT      /* no reply in time */

/* --- usage (snapfgctl-usage.c) --- */

/* The command as snapfgctl spells it ("checkpoint create"); a static
 * buffer, valid until the next call.
 */
extern const char *cli_name (const struct control_command *c);
/* The command named by the first one or two words (NULL: none); *used
 * says how many words its name took.
 */
extern const struct control_command *find_command (char **words,
                                                   size_t nwords,
                                                   size_t *used);
/* "create NAME --cow PATH [--store persistent|transient] ..." */
extern void print_synopsis (FILE *fp, const struct control_command *c);
extern void usage (FILE *fp);
extern void command_help (FILE *fp, const struct control_command *c);
extern void inspect_help (FILE *fp);
extern void help_help (FILE *fp);

/* --- the command line (snapfgctl-args.c) --- */

/* Options of every command, collected while getopt permutes the line. */
struct option_value {
  const char *name;
  bool is_bool;
  const char *value;            /* NULL: not given */
};

struct cmdline {
  const char *socket_path;
  bool json_output, help, version, exceptions;
  bool stdio, drop_on_hangup;   /* --stdio [--drop-on-hangup] */
  int timeout;                  /* --timeout: seconds for each reply */
  struct option_value *opts;
  size_t nopts;
  char **words;                 /* the command and its positional args */
  size_t nwords;
};

/* Fill CL from argv (cl->opts and cl->words are malloc'd); -1 when
 * getopt refused something (it said what).
 */
extern int parse_cmdline (int argc, char *argv[], struct cmdline *cl);
/* The value of --NAME ("true" for a flag), NULL if not given. */
extern const char *option_value (const struct cmdline *cl, const char *name);
/* The request for the command line (NULL: a usage error, said). */
extern json_t *build_request (const struct cmdline *cl,
                              const struct control_command *c);

/* --stdio (snapfgctl-stdio.c): bridge stdin and stdout to the socket
 * until stdin ends; an exit status.
 */
extern int snapfgctl_stdio (const char *socket_path, int timeout,
                            bool drop_on_hangup);

/* --- output (snapfgctl-output.c) --- */

/* A reply's member as a number (0 if absent) or string ("" if absent). */
extern uint64_t get_u64 (json_t *obj, const char *key);
extern const char *get_str (json_t *obj, const char *key);
/* Print the reply R to request REQ for people. */
extern void print_human (const struct control_command *c,
                         const struct cmdline *cl, json_t *req, json_t *r);

/* inspect COW: print the store's header and usage (or JSON). */
extern int snapfgctl_inspect (const char *path, bool exceptions,
                              bool json_output);

/* Print the stats and status replies in the Prometheus text format. */
extern void snapfgctl_print_prometheus (json_t *stats, json_t *status);

#endif
