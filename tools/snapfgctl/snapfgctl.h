/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl: the parts shared by its source files.
 *
 *   snapfgctl.c             main: which command, running it, merge --wait
 *   snapfgctl-args.c        the command line and the request it makes
 *   snapfgctl-usage.c       usage and --help texts, from the table
 *   snapfgctl-conn.c        talking to the server (JSON lines)
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

/* Exit statuses (documented in snapfgctl(1)). */
#define EXIT_OK          0
#define EXIT_REFUSED     1      /* the server refused; inspect: bad store */
#define EXIT_USAGE       2
#define EXIT_UNREACHABLE 3      /* no connection or no reply */

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

/* --- talking to the server (snapfgctl-conn.c) --- */


struct conn {
  const char *path;
  int fd;
  char_vector buf;              /* received, not yet returned */
};

/* 0, or -1 after a message. */
extern int conn_open (struct conn *cn, const char *path);
extern void conn_close (struct conn *cn);
/* Send one request, read its reply.  Returns the parsed reply (and the
 * line in *line if wanted, malloc'd), or NULL if the server could not be
 * talked to (said).
 */
extern json_t *conn_call (struct conn *cn, json_t *req, char **line);
/* A refusal's message. */
extern const char *reply_error (json_t *reply);

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
