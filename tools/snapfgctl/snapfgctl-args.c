/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl: the command line.
 *
 * getopt_long over the global options and every --option of the
 * command table (permuting, so options may be anywhere on the line),
 * then the request for the chosen command: its positional arguments and
 * options checked against the table, sizes with nbdkit's suffixes,
 * relative paths made absolute.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <getopt.h>
#include <unistd.h>
#include <limits.h>

#include <jansson.h>

#include "cleanup.h"
#include "control-client.h"
#include "control-commands.h"
#include "device.h"
#include "snapfgctl.h"
#include "tool-output.h"

/* A size with nbdkit's suffixes (as nbdkit_parse_size takes them). */
static int
parse_size (const char *what, const char *str, uint64_t *out)
{
  char *end;
  unsigned long long v;
  int shift = 0;

  const char *p = str;

  /* Like nbdkit_parse_size: leading blanks and a '+' are fine, a '-'
   * is not (strtoull would quietly negate it).
   */
  while (*p == ' ' || *p == '\t')
    p++;
  if (*p == '+')
    p++;
  errno = 0;
  if (*p < '0' || *p > '9')
    goto bad;
  v = strtoull (p, &end, 10);
  if (errno)
    goto bad;
  switch (*end) {
  case '\0': break;
  case 'b': case 'B': end++; break;
  case 's': case 'S': shift = 9; end++; break;
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  case 't': case 'T': shift = 40; end++; break;
  case 'p': case 'P': shift = 50; end++; break;
  case 'e': case 'E': shift = 60; end++; break;
  default: goto bad;
  }
  if (*end != '\0' || v > ((uint64_t) INT64_MAX >> shift))
    goto bad;
  if (v == 0) {
    tool_error ("%s: must be greater than zero: %s",
                what, str);
    return -1;
  }
  *out = (uint64_t) v << shift;
  return 0;
 bad:
  tool_error ("%s: not a valid size: %s (a number with "
              "an optional suffix b, s, k, m, g, t, p or e)", what, str);
  return -1;
}

#define OPT_TIMEOUT 257
#define OPT_STDIO 258
#define OPT_DROP_ON_HANGUP 259
#define OPT_PROGRESS 260
#define OPT_TABLE 512           /* + index into the option_value list */

int
parse_cmdline (int argc, char *argv[], struct cmdline *cl)
{
  static const struct option global[] = {
    { "socket", required_argument, NULL, 'S' },
    { "json", no_argument, NULL, 'j' },
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, 'V' },
    { "timeout", required_argument, NULL, OPT_TIMEOUT },
    { "stdio", no_argument, NULL, OPT_STDIO },
    { "drop-on-hangup", no_argument, NULL, OPT_DROP_ON_HANGUP },
    { "progress", required_argument, NULL, OPT_PROGRESS },
    { "exceptions", no_argument, NULL, 'e' },
  };
  const size_t nglobal = sizeof global / sizeof global[0];
  CLEANUP_FREE struct option *longopts = NULL;
  int c;

  /* The distinct --options of the table's commands. */
  cl->opts = calloc (control_nargs, sizeof *cl->opts);
  longopts = calloc (nglobal + control_nargs + 1, sizeof *longopts);
  cl->words = calloc (argc + 1, sizeof *cl->words);
  if (cl->opts == NULL || longopts == NULL || cl->words == NULL) {
    tool_error ("out of memory");
    return -1;
  }
  memcpy (longopts, global, sizeof global);
  for (size_t i = 0; i < control_nargs; ++i) {
    const struct control_arg *a = &control_args[i];
    bool known = false;

    if (a->option == NULL)
      continue;
    for (size_t j = 0; j < cl->nopts; ++j)
      known |= strcmp (cl->opts[j].name, a->option) == 0;
    if (known)
      continue;
    cl->opts[cl->nopts].name = a->option;
    cl->opts[cl->nopts].is_bool = a->type == CONTROL_TYPE_BOOL;
    longopts[nglobal + cl->nopts] = (struct option) {
      a->option, a->type == CONTROL_TYPE_BOOL ? no_argument
      : required_argument, NULL, OPT_TABLE + (int) cl->nopts
    };
    cl->nopts++;
  }

  /* "-" first: every word comes back in order as option 1, whatever
   * POSIXLY_CORRECT says, so options may be anywhere on the line.
   */
  opterr = 1;
  while ((c = getopt_long (argc, argv, "-S:jheV", longopts, NULL)) != -1) {
    switch (c) {
    case 1: cl->words[cl->nwords++] = optarg; break;
    case 'S': cl->socket_path = optarg; break;
    case 'j': cl->json_output = true; break;
    case 'h': cl->help = true; break;
    case 'e': cl->exceptions = true; break;
    case 'V': cl->version = true; break;
    case OPT_STDIO: cl->stdio = true; break;
    case OPT_DROP_ON_HANGUP: cl->drop_on_hangup = true; break;
    case OPT_PROGRESS:
      if (tool_parse_progress (optarg, &tool_out.progress) == -1) {
        tool_error ("--progress=%s: auto, always or never",
                    optarg);
        return -1;
      }
      break;
    case OPT_TIMEOUT:
      if (tool_parse_timeout (optarg, 0, &cl->timeout) == -1) {
        tool_error ("--timeout: not a number of seconds "
                    "(0 for none, at most %d): %s", TOOL_MAX_TIMEOUT, optarg);
        return -1;
      }
      break;
    default:
      if (c >= OPT_TABLE && c < OPT_TABLE + (int) cl->nopts) {
        struct option_value *o = &cl->opts[c - OPT_TABLE];
        o->value = o->is_bool ? "true" : optarg;
        break;
      }
      return -1;                /* getopt said what was wrong */
    }
  }
  /* After "--", getopt leaves the rest. */
  while (optind < argc)
    cl->words[cl->nwords++] = argv[optind++];
  return 0;
}

const char *
option_value (const struct cmdline *cl, const char *name)
{
  for (size_t i = 0; i < cl->nopts; ++i)
    if (strcmp (cl->opts[i].name, name) == 0)
      return cl->opts[i].value;
  return NULL;
}

/* A relative path made absolute: the server runs in "/". */
static char *
absolute_path (const char *path)
{
  char cwd[PATH_MAX], *abs;

  if (path[0] == '/' || device_is_uri (path))
    return strdup (path);
  if (getcwd (cwd, sizeof cwd) == NULL) {
    tool_error ("getcwd: %m");
    return NULL;
  }
  if (asprintf (&abs, "%s/%s", cwd, path) == -1)
    return NULL;
  return abs;
}

/* Put one argument's value into the request.  Returns 0 or -1 (said). */
static int
add_arg (json_t *req, const struct control_command *c,
         const struct control_arg *a, const char *value)
{
  json_t *v = NULL;
  char what[64];

  if (a->option)
    snprintf (what, sizeof what, "%s --%s", cli_name (c), a->option);
  else
    snprintf (what, sizeof what, "%s %s", cli_name (c), a->metavar);
  switch (a->type) {
  case CONTROL_TYPE_SIZE: {
    uint64_t size;
    if (parse_size (what, value, &size) < 0)
      return -1;
    v = json_integer ((json_int_t) size);
    break;
  }
  case CONTROL_TYPE_BOOL:
    v = json_true ();
    break;
  case CONTROL_TYPE_PATH: {
    char *abs = absolute_path (value);
    if (abs == NULL)
      return -1;
    v = json_string (abs);
    free (abs);
    break;
  }
  case CONTROL_TYPE_STRING:
  case CONTROL_TYPE_NAME:
    v = json_string (value);
    break;
  }
  if (v == NULL) {
    tool_error ("%s: not valid UTF-8: the protocol (and NBD "
                "export names) need UTF-8", what);
    return -1;
  }
  json_object_set_new (req, a->key, v);
  return 0;
}

/* The request for the command line (NULL: a usage error, said). */
json_t *
build_request (const struct cmdline *cl, const struct control_command *c)
{
  json_t *req = control_request (c->cmd);   /* {"cmd": NAME} */
  size_t word = 1;

  if (req == NULL)
    return NULL;

  /* Every option given must be one of this command's. */
  for (size_t i = 0; i < cl->nopts; ++i) {
    const struct control_arg *a = NULL;

    if (cl->opts[i].value == NULL)
      continue;
    for (size_t j = 0; j < control_nargs; ++j)
      if (control_args[j].cmd == c->cmd && control_args[j].option &&
          strcmp (control_args[j].option, cl->opts[i].name) == 0)
        a = &control_args[j];
    if (a == NULL) {
      tool_error ("%s does not take --%s (see snapfgctl %s "
                  "--help)", cli_name (c), cl->opts[i].name, cli_name (c));
      goto usage;
    }
  }
  if (cl->exceptions) {
    tool_error ("--exceptions is an option of inspect");
    goto usage;
  }

  for (size_t i = 0; i < control_nargs; ++i) {
    const struct control_arg *a = &control_args[i];
    const char *value;

    if (a->cmd != c->cmd)
      continue;
    if (a->flags & CONTROL_ARG_POSITIONAL)
      value = word < cl->nwords ? cl->words[word++] : NULL;
    else
      value = option_value (cl, a->option);
    if (value == NULL) {
      if (a->flags & CONTROL_ARG_REQUIRED) {
        if (a->option)
          tool_error ("%s needs --%s %s", cli_name (c),
                      a->option, a->metavar);
        else
          tool_error ("%s needs %s", cli_name (c),
                      a->metavar);
        goto usage;
      }
      continue;
    }
    if (a->flags & CONTROL_ARG_LOCAL)
      continue;                 /* snapfgctl's own: not sent */
    if (add_arg (req, c, a, value) < 0)
      goto usage;
  }
  if (word < cl->nwords) {
    tool_error ("%s: unexpected argument '%s'",
                cli_name (c), cl->words[word]);
    goto usage;
  }
  return req;

 usage:
  fprintf (stderr, "usage: snapfgctl -S SOCKET ");
  print_synopsis (stderr, c);
  fprintf (stderr, "\n");
  json_decref (req);
  return NULL;
}
