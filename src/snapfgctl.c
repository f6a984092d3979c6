/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl: inspect and control snapfg (see snapfgctl(1)).
 *
 *   snapfgctl [-S SOCKET] [--json] COMMAND [ARGS] [OPTIONS]
 *
 * sends one request to a running server's control socket (control=) and
 * prints the reply; "inspect COW" reads a COW store on disk instead.
 * The commands, their arguments and options, and the usage text all
 * come from the table in control-commands.def.  Options may come
 * anywhere on the line (GNU style): "status --json" is "--json status".
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <getopt.h>
#include <unistd.h>
#include <limits.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <jansson.h>

#include "control-commands.h"
#include "device.h"
#include "snapfgctl.h"

/* --- usage, from the table --- */

/* The command as snapfgctl spells it ("checkpoint create"). */
static const char *
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
static const struct control_command *
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
static void
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

static void
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
           "  -h, --help           this help, or a command's\n"
           "  --version            print the version\n"
           "\n"
           "Sizes take nbdkit's suffixes: b, s (512-byte sectors), k, m, g, "
           "t, p, e\n(powers of 1024, either case).\n"
           "Exit status: 0 done, 1 refused by the server (or a bad store), "
           "2 usage error,\n3 the server cannot be reached.  See "
           "snapfgctl(1).\n",
           "inspect", "print the header and usage of a COW store (read only)",
           "help", "this help, or one command's");
}

static void
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

static void
inspect_help (FILE *fp)
{
  fprintf (fp, "usage: snapfgctl [--json] inspect [--exceptions] COW\n\n"
           "Print the header and usage of a COW store (dm-snapshot's "
           "persistent format);\nread only, needs no server.\n"
           "  %-26s %s\n", "-e, --exceptions",
           "also print every exception: old_chunk new_chunk");
}

static void
help_help (FILE *fp)
{
  fprintf (fp, "usage: snapfgctl help [COMMAND]\n\n"
           "The list of commands, or one command's usage (the same as "
           "COMMAND --help).\n");
}

/* --- arguments --- */

/* A size with nbdkit's suffixes (as nbdkit_parse_size takes them). */
static int
parse_size (const char *what, const char *str, uint64_t *out)
{
  char *end;
  unsigned long long v;
  int shift = 0;

  errno = 0;
  if (str[0] < '0' || str[0] > '9')
    goto bad;
  v = strtoull (str, &end, 10);
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
    fprintf (stderr, "snapfgctl: %s: must be greater than zero: %s\n",
             what, str);
    return -1;
  }
  *out = (uint64_t) v << shift;
  return 0;
 bad:
  fprintf (stderr, "snapfgctl: %s: not a valid size: %s (a number with "
           "an optional suffix b, s, k, m, g, t, p or e)\n", what, str);
  return -1;
}

/* Options of every command, collected while getopt permutes the line. */
struct option_value {
  const char *name;
  bool is_bool;
  const char *value;            /* NULL: not given */
};

#define OPT_VERSION 256
#define OPT_TABLE 512           /* + index into the option_value list */

struct cmdline {
  const char *socket_path;
  bool json_output, help, version, exceptions;
  struct option_value *opts;
  size_t nopts;
  char **words;                 /* the command and its positional args */
  size_t nwords;
};

static int
parse_cmdline (int argc, char *argv[], struct cmdline *cl)
{
  static const struct option global[] = {
    { "socket", required_argument, NULL, 'S' },
    { "json", no_argument, NULL, 'j' },
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, OPT_VERSION },
    { "exceptions", no_argument, NULL, 'e' },
  };
  const size_t nglobal = sizeof global / sizeof global[0];
  struct option *longopts;
  int c;

  /* The distinct --options of the table's commands. */
  cl->opts = calloc (control_nargs, sizeof *cl->opts);
  longopts = calloc (nglobal + control_nargs + 1, sizeof *longopts);
  cl->words = calloc (argc + 1, sizeof *cl->words);
  if (cl->opts == NULL || longopts == NULL || cl->words == NULL) {
    free (longopts);
    fprintf (stderr, "snapfgctl: out of memory\n");
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
  while ((c = getopt_long (argc, argv, "-S:jhe", longopts, NULL)) != -1) {
    switch (c) {
    case 1: cl->words[cl->nwords++] = optarg; break;
    case 'S': cl->socket_path = optarg; break;
    case 'j': cl->json_output = true; break;
    case 'h': cl->help = true; break;
    case 'e': cl->exceptions = true; break;
    case OPT_VERSION: cl->version = true; break;
    default:
      if (c >= OPT_TABLE && c < OPT_TABLE + (int) cl->nopts) {
        struct option_value *o = &cl->opts[c - OPT_TABLE];
        o->value = o->is_bool ? "true" : optarg;
        break;
      }
      free (longopts);
      return -1;                /* getopt said what was wrong */
    }
  }
  /* After "--", getopt leaves the rest. */
  while (optind < argc)
    cl->words[cl->nwords++] = argv[optind++];
  free (longopts);
  return 0;
}

static const char *
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
    fprintf (stderr, "snapfgctl: getcwd: %m\n");
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
    fprintf (stderr, "snapfgctl: %s: not valid UTF-8: the protocol (and NBD "
             "export names) need UTF-8\n", what);
    return -1;
  }
  json_object_set_new (req, a->key, v);
  return 0;
}

/* The request for the command line (NULL: a usage error, said). */
static json_t *
build_request (const struct cmdline *cl, const struct control_command *c)
{
  json_t *req = json_object ();
  size_t word = 1;

  if (req == NULL)
    return NULL;
  json_object_set_new (req, "cmd", json_string (c->name));

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
      fprintf (stderr, "snapfgctl: %s does not take --%s (see snapfgctl %s "
               "--help)\n", cli_name (c), cl->opts[i].name, cli_name (c));
      goto usage;
    }
  }
  if (cl->exceptions) {
    fprintf (stderr, "snapfgctl: --exceptions is an option of inspect\n");
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
          fprintf (stderr, "snapfgctl: %s needs --%s %s\n", cli_name (c),
                   a->option, a->metavar);
        else
          fprintf (stderr, "snapfgctl: %s needs %s\n", cli_name (c),
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
    fprintf (stderr, "snapfgctl: %s: unexpected argument '%s'\n",
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

/* --- talking to the server --- */

struct conn {
  const char *path;
  int fd;
  char *buf;                    /* received, not yet returned */
  size_t len, cap;
};

static int
conn_open (struct conn *cn, const char *path)
{
  struct sockaddr_un addr = { .sun_family = AF_UNIX };

  memset (cn, 0, sizeof *cn);
  cn->path = path;
  if (strlen (path) >= sizeof addr.sun_path) {
    fprintf (stderr, "snapfgctl: %s: socket path too long\n", path);
    return -1;
  }
  strcpy (addr.sun_path, path);
  cn->fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (cn->fd == -1 ||
      connect (cn->fd, (struct sockaddr *) &addr, sizeof addr) == -1) {
    fprintf (stderr, "snapfgctl: cannot connect to %s: %m\n", path);
    if (cn->fd >= 0)
      close (cn->fd);
    cn->fd = -1;
    return -1;
  }
  return 0;
}

static void
conn_close (struct conn *cn)
{
  if (cn->fd >= 0)
    close (cn->fd);
  free (cn->buf);
  cn->fd = -1;
  cn->buf = NULL;
}

/* Send one request, read its reply.  Returns the parsed reply (and the
 * line in *line if wanted, malloc'd), or NULL if the server could not be
 * talked to (said).
 */
static json_t *
conn_call (struct conn *cn, json_t *req, char **line)
{
  char *text = json_dumps (req, JSON_COMPACT);
  size_t len;
  char *nl;
  json_error_t jerr;
  json_t *reply;

  if (text == NULL) {
    fprintf (stderr, "snapfgctl: out of memory\n");
    return NULL;
  }
  len = strlen (text);
  text[len] = '\n';             /* json_dumps's NUL becomes the newline */
  for (size_t off = 0; off < len + 1; ) {
    ssize_t n = write (cn->fd, text + off, len + 1 - off);
    if (n == -1) {
      if (errno == EINTR)
        continue;
      fprintf (stderr, "snapfgctl: writing to %s: %m\n", cn->path);
      free (text);
      return NULL;
    }
    off += n;
  }
  free (text);

  while ((nl = cn->len ? memchr (cn->buf, '\n', cn->len) : NULL) == NULL) {
    ssize_t n;

    if (cn->cap - cn->len < 4096) {
      size_t cap = cn->cap ? cn->cap * 2 : 65536;
      char *p = realloc (cn->buf, cap);
      if (p == NULL) {
        fprintf (stderr, "snapfgctl: out of memory\n");
        return NULL;
      }
      cn->buf = p;
      cn->cap = cap;
    }
    n = read (cn->fd, cn->buf + cn->len, cn->cap - cn->len);
    if (n == -1 && errno == EINTR)
      continue;
    if (n <= 0) {
      fprintf (stderr, "snapfgctl: no reply from %s%s%s\n", cn->path,
               n < 0 ? ": " : " (the connection was closed)",
               n < 0 ? strerror (errno) : "");
      return NULL;
    }
    cn->len += n;
  }
  len = nl - cn->buf;
  reply = json_loadb (cn->buf, len, JSON_REJECT_DUPLICATES, &jerr);
  if (reply == NULL || !json_is_object (reply) ||
      !json_is_boolean (json_object_get (reply, "ok"))) {
    fprintf (stderr, "snapfgctl: unreadable reply from %s: %s\n", cn->path,
             reply ? "not an object with \"ok\"" : jerr.text);
    json_decref (reply);
    return NULL;
  }
  if (line) {
    *line = strndup (cn->buf, len + 1);
    if (*line == NULL) {
      json_decref (reply);
      return NULL;
    }
  }
  memmove (cn->buf, nl + 1, cn->len - len - 1);
  cn->len -= len + 1;
  return reply;
}

static const char *
reply_error (json_t *reply)
{
  const char *msg = json_string_value (json_object_get (reply, "error"));

  return msg ? msg : "the server refused the request";
}

/* --- human output --- */

static uint64_t
get_u64 (json_t *obj, const char *key)
{
  json_t *v = json_object_get (obj, key);

  return json_is_integer (v) ? (uint64_t) json_integer_value (v) : 0;
}

static double
get_double (json_t *obj, const char *key)
{
  return json_number_value (json_object_get (obj, key));
}

static const char *
get_str (json_t *obj, const char *key)
{
  const char *s = json_string_value (json_object_get (obj, key));

  return s ? s : "";
}

static void
print_snapshot (json_t *sn)
{
  printf ("%s: %s, %s", get_str (sn, "name"), get_str (sn, "state"),
          get_str (sn, "status"));
  printf ("; %s store, chunk %" PRIu64 ", COW %s; %" PRIu64 " exceptions, "
          "%" PRIu64 " connections", get_str (sn, "store"),
          get_u64 (sn, "chunk_size"), get_str (sn, "cow"),
          get_u64 (sn, "exceptions"), get_u64 (sn, "connections"));
  if (json_object_get (sn, "merge_total"))
    printf ("; merged %" PRIu64 " of %" PRIu64 " chunks",
            get_u64 (sn, "merge_done"), get_u64 (sn, "merge_total"));
  if (strcmp (get_str (sn, "state"), "Invalid") == 0)
    printf ("; its contents are lost: drop it and create a new one (with a "
            "larger --cow-size if its store was full)");
  printf ("\n");
}

static void
print_human (const struct control_command *c, const struct cmdline *cl,
             json_t *req, json_t *r)
{
  const char *name = get_str (req, "name");
  json_t *a, *x;
  size_t i;

  switch (c->cmd) {
  case CONTROL_STATUS:
    x = json_object_get (r, "origin");
    if (x)
      printf ("origin: %s, %" PRIu64 " bytes, block size %" PRIu64 ", %"
              PRIu64 " connections\n", get_str (x, "path"),
              get_u64 (x, "size"), get_u64 (x, "block_size"),
              get_u64 (x, "connections"));
    json_array_foreach (json_object_get (r, "snapshots"), i, x)
      print_snapshot (x);
    break;
  case CONTROL_LIST:
    printf ("origin\n");
    json_array_foreach (json_object_get (r, "snapshots"), i, x)
      printf ("%s\t%s\t%s\n", get_str (x, "name"), get_str (x, "state"),
              get_str (x, "status"));
    break;
  case CONTROL_CHECKPOINT_LIST:
    json_array_foreach (json_object_get (r, "checkpoints"), i, x) {
      json_t *snap = json_object_get (x, "snapshot");

      printf ("%s\t%s\tseq %" PRIu64 "\tgranularity %" PRIu64 "\t%" PRIu64
              " bytes dirty\tcreated %" PRIu64 "%s%s\n", get_str (x, "name"),
              get_str (x, "state"), get_u64 (x, "seq"),
              get_u64 (x, "granularity"), get_u64 (x, "dirty_bytes"),
              get_u64 (x, "created"), json_is_string (snap)
              ? "\tsnapshot " : "", json_is_string (snap)
              ? json_string_value (snap) : "");
    }
    break;
  case CONTROL_CHECKPOINT_CREATE:
    printf ("created checkpoint %s\n", name);
    break;
  case CONTROL_CHECKPOINT_DROP:
    printf ("dropped checkpoint %s (its changes are kept by the one "
            "before it, if any)\n", name);
    break;
  case CONTROL_CHANGED:
    a = json_object_get (r, "ranges");
    json_array_foreach (a, i, x)
      printf ("%" PRIu64 " %" PRIu64 "\n", get_u64 (x, "offset"),
              get_u64 (x, "length"));
    printf ("# %zu ranges, %" PRIu64 " bytes changed\n", json_array_size (a),
            get_u64 (r, "bytes"));
    break;
  case CONTROL_STATS:
    printf ("%-12s %5s %10s %12s %12s %9s %12s %10s %9s %9s %10s %10s\n",
            "export", "conns", "requests", "bytes-read", "bytes-written",
            "copy-outs", "bytes-copied", "exceptions", "pending", "contended",
            "p50-us", "p99-us");
    json_array_foreach (json_object_get (r, "exports"), i, x) {
      printf ("%-12s %5" PRIu64 " %10" PRIu64 " %12" PRIu64 " %12" PRIu64
              " %9" PRIu64 " %12" PRIu64 " %10" PRIu64 " %9" PRIu64
              " %9" PRIu64 " %10.1f %10.1f\n",
              get_str (x, "export"), get_u64 (x, "connections"),
              get_u64 (x, "requests"), get_u64 (x, "bytes_read"),
              get_u64 (x, "bytes_written"), get_u64 (x, "copy_outs"),
              get_u64 (x, "bytes_copied"), get_u64 (x, "exceptions"),
              get_u64 (x, "pending_waits"), get_u64 (x, "lock_contention"),
              get_double (x, "latency_p50_us"),
              get_double (x, "latency_p99_us"));
    }
    break;
  case CONTROL_CREATE:
    x = json_object_get (r, "snapshot");
    printf ("created snapshot %s: %s store, chunk %" PRIu64 ", COW %s\n",
            name, get_str (x, "store"), get_u64 (x, "chunk_size"),
            get_str (x, "cow"));
    break;
  case CONTROL_DROP:
    if (json_is_true (json_object_get (r, "cow_removed")))
      printf ("dropped snapshot %s (its COW store in the state directory "
              "is removed)\n", name);
    else
      printf ("dropped snapshot %s (its COW store is left as it is)\n", name);
    break;
  case CONTROL_MERGE:
    if (option_value (cl, "wait") == NULL)
      printf ("merging snapshot %s into the origin (snapfgctl status shows "
              "the progress)\n", name);
    break;
  case CONTROL_SET_BLOCK_SIZE:
    printf ("block size %" PRIu64 " for new connections\n",
            get_u64 (req, "block_size"));
    break;
  default:
    /* A command without a human form yet: its reply as it is. */
    {
      char *s = json_dumps (r, JSON_INDENT (2));
      if (s)
        printf ("%s\n", s);
      free (s);
    }
  }
}

/* merge --wait: poll status until the snapshot is gone (merged), with a
 * progress line on a terminal.
 */
static int
wait_for_merge (struct conn *cn, const char *name, bool quiet)
{
  bool tty = !quiet && isatty (STDERR_FILENO);
  json_t *req = json_pack ("{ssss}", "cmd", "status", "name", name);
  int status = EXIT_UNREACHABLE;

  if (req == NULL)
    return EXIT_REFUSED;
  for (;;) {
    json_t *reply = conn_call (cn, req, NULL), *sn;
    const char *state;

    if (reply == NULL)
      break;
    if (!json_is_true (json_object_get (reply, "ok"))) {
      /* Gone from the list: the merge is done. */
      json_decref (reply);
      if (tty)
        fprintf (stderr, "\r\033[K");
      if (!quiet)
        printf ("merged snapshot %s into the origin\n", name);
      status = EXIT_OK;
      break;
    }
    sn = json_array_get (json_object_get (reply, "snapshots"), 0);
    state = get_str (sn, "state");
    if (strcmp (state, "merged") == 0) {
      /* The merge ended between our request and the reply. */
      json_decref (reply);
      if (tty)
        fprintf (stderr, "\r\033[K");
      if (!quiet)
        printf ("merged snapshot %s into the origin\n", name);
      status = EXIT_OK;
      break;
    }
    if (strcmp (state, "merging") != 0) {
      if (tty)
        fprintf (stderr, "\n");
      fprintf (stderr, "snapfgctl: merge of %s stopped: the snapshot is "
               "%s (%s)\n", name, state, get_str (sn, "status"));
      json_decref (reply);
      status = EXIT_REFUSED;
      break;
    }
    if (tty) {
      uint64_t done = get_u64 (sn, "merge_done");
      uint64_t total = get_u64 (sn, "merge_total");
      fprintf (stderr, "\rmerging %s: %" PRIu64 " of %" PRIu64 " chunks "
               "(%.0f%%)\033[K", name, done, total,
               total ? 100.0 * done / total : 100.0);
    }
    json_decref (reply);
    nanosleep (&(struct timespec) { .tv_nsec = 200 * 1000 * 1000 }, NULL);
  }
  json_decref (req);
  return status;
}

static int
run_command (const struct cmdline *cl, const struct control_command *c)
{
  json_t *req, *reply, *status_reply = NULL;
  bool prometheus = c->cmd == CONTROL_STATS &&
    option_value (cl, "prometheus") != NULL;
  struct conn cn;
  char *line = NULL;
  int st;

  req = build_request (cl, c);
  if (req == NULL)
    return EXIT_USAGE;
  if (cl->socket_path == NULL) {
    fprintf (stderr, "snapfgctl: %s: give the server's control socket with "
             "-S SOCKET\n", cli_name (c));
    json_decref (req);
    return EXIT_USAGE;
  }
  if (prometheus && cl->json_output) {
    fprintf (stderr, "snapfgctl: stats: --json and --prometheus exclude "
             "each other\n");
    json_decref (req);
    return EXIT_USAGE;
  }
  if (conn_open (&cn, cl->socket_path) < 0) {
    json_decref (req);
    return EXIT_UNREACHABLE;
  }
  reply = conn_call (&cn, req, &line);
  if (reply == NULL) {
    json_decref (req);
    conn_close (&cn);
    return EXIT_UNREACHABLE;
  }
  if (!json_is_true (json_object_get (reply, "ok"))) {
    if (cl->json_output)
      fputs (line, stdout);
    fprintf (stderr, "snapfgctl: %s\n", reply_error (reply));
    st = EXIT_REFUSED;
    goto out;
  }
  st = EXIT_OK;
  if (prometheus) {
    /* The COW usage and states come from status, on the same connection. */
    json_t *sreq = json_pack ("{ss}", "cmd", "status");
    status_reply = sreq ? conn_call (&cn, sreq, NULL) : NULL;
    json_decref (sreq);
    if (status_reply == NULL) {
      st = EXIT_UNREACHABLE;
      goto out;
    }
    snapfgctl_print_prometheus (reply, status_reply);
  }
  else if (cl->json_output)
    fputs (line, stdout);
  else
    print_human (c, cl, req, reply);
  if (c->cmd == CONTROL_MERGE && option_value (cl, "wait")) {
    fflush (stdout);
    st = wait_for_merge (&cn, get_str (req, "name"), cl->json_output);
  }

 out:
  if (fflush (stdout) == EOF && st == EXIT_OK) {
    fprintf (stderr, "snapfgctl: writing the output: %m\n");
    st = EXIT_REFUSED;
  }
  json_decref (status_reply);
  json_decref (reply);
  json_decref (req);
  free (line);
  conn_close (&cn);
  return st;
}

/* Run what the command line asks for. */
static int
dispatch (struct cmdline cl)
{
  const struct control_command *c;
  const char *cmd;
  size_t used;

  if (cl.version) {
    printf ("snapfgctl %s\n", PACKAGE_VERSION);
    return EXIT_OK;
  }
  if (cl.nwords == 0) {
    usage (cl.help ? stdout : stderr);
    return cl.help ? EXIT_OK : EXIT_USAGE;
  }

  if (strcmp (cl.words[0], "help") == 0) {
    /* help [COMMAND] is COMMAND --help. */
    if (cl.nwords == 1) {
      if (cl.help)
        help_help (stdout);     /* help --help */
      else
        usage (stdout);
      return EXIT_OK;
    }
    cl.words++;
    cl.nwords--;
    cl.help = true;
    if (strcmp (cl.words[0], "help") == 0 && cl.nwords == 1) {
      help_help (stdout);       /* help help */
      return EXIT_OK;
    }
  }
  cmd = cl.words[0];
  if (strcmp (cmd, "inspect") == 0) {
    if (cl.help) {
      inspect_help (stdout);
      return EXIT_OK;
    }
    for (size_t i = 0; i < cl.nopts; ++i)
      if (cl.opts[i].value) {
        fprintf (stderr, "snapfgctl: inspect does not take --%s\n",
                 cl.opts[i].name);
        return EXIT_USAGE;
      }
    if (cl.nwords != 2) {
      inspect_help (stderr);
      return EXIT_USAGE;
    }
    return snapfgctl_inspect (cl.words[1], cl.exceptions, cl.json_output);
  }
  c = find_command (cl.words, cl.nwords, &used);
  if (c == NULL) {
    fprintf (stderr, "snapfgctl: unknown command '%s' (see snapfgctl "
             "help)\n", cmd);
    return EXIT_USAGE;
  }
  /* The command's arguments follow its one or two words. */
  cl.words += used - 1;
  cl.nwords -= used - 1;
  if (cl.help) {
    command_help (stdout, c);
    return EXIT_OK;
  }
  return run_command (&cl, c);
}

int
main (int argc, char *argv[])
{
  struct cmdline cl = { .socket_path = NULL };
  int st;

  if (parse_cmdline (argc, argv, &cl) < 0) {
    fprintf (stderr, "Try 'snapfgctl help'.\n");
    st = EXIT_USAGE;
  }
  else
    st = dispatch (cl);         /* a copy: it may move cl.words */
  free (cl.words);
  free (cl.opts);
  return st;
}
