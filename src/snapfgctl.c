/* snapfgctl: inspect and control snapfg.
 *
 *   snapfgctl inspect [--exceptions] COW
 *
 * prints what a COW store holds (header, usage as dm's status line, and
 * optionally every exception) without writing to it, and exits non-zero
 * with a message naming the problem when the store is corrupt.
 *
 *   snapfgctl -S SOCKET [--json] COMMAND [ARGS]
 *
 * sends one request to a running server's control socket (control=) and
 * prints the reply (see control-protocol.h and snapfgctl(1)).
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
#include <sys/socket.h>
#include <sys/un.h>

#include "device.h"
#include "dm-format.h"
#include "store-binding.h"
#include "exception-table.h"
#include "snapfg-log.h"
#include "json.h"
#include "control-protocol.h"

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: snapfgctl inspect [--exceptions] COW\n"
           "       snapfgctl -S SOCKET [--json] COMMAND [ARGS]\n"
           "\n"
           "  inspect COW     print the header and usage of a COW store\n"
           "                  (dm-snapshot persistent format); read only\n"
           "  --exceptions    also print every exception: old_chunk new_chunk\n"
           "\n"
           "Commands for a running server (nbdkit snapfg ... control=SOCKET):\n"
           "  status [NAME]             snapshots: state, usage, chunk size, store\n"
           "  list                      the exports, one per line\n"
           "  create NAME [--cow PATH] [--store persistent|transient]\n"
           "         [--chunk-size N] [--cow-size N] [--checkpoint CKPT]\n"
           "                            take a snapshot now (and start checkpoint\n"
           "                            CKPT at the same instant)\n"
           "  drop NAME                 remove a snapshot\n"
           "  set-block-size 512|4096   advertised block size (new connections)\n"
           "  merge NAME                merge a persistent snapshot into the origin\n"
           "  changed NAME              origin ranges written since the snapshot\n"
           "  changed --since CKPT [SNAPSHOT]\n"
           "                            origin ranges changed since checkpoint CKPT\n"
           "                            (up to now, or up to SNAPSHOT's instant)\n"
           "  checkpoint create NAME    start a checkpoint (changed-block tracking)\n"
           "  checkpoint list           the checkpoints, oldest first\n"
           "  checkpoint drop NAME      remove a checkpoint (its changes go to the\n"
           "                            one before it)\n"
           "  stats                     per-export counters and latency\n"
           "  --json                    print the server's JSON reply\n");
}

struct inspect_state {
  struct exception_table seen;    /* finds two pairs for one old chunk */
  bool print;
};

static int
inspect_pair (void *opaque, uint64_t old_chunk, uint64_t new_chunk)
{
  struct inspect_state *is = opaque;
  int r = exception_table_insert (&is->seen, old_chunk, new_chunk);

  if (r < 0)
    return r;
  if (is->print)
    printf ("%" PRIu64 " %" PRIu64 "\n", old_chunk, new_chunk);
  return 0;
}

/* The binding record snapfg keeps in the header chunk (store-binding.h). */
static void
print_binding (const struct snapfg_device *dev, const struct dm_header *h)
{
  unsigned char sector[512];
  struct store_binding b;

  if (h->snapfg_merging)
    printf ("merge mark: a merge into the origin is in progress\n");
  if (device_pread (dev, sector, sizeof sector, 0) < 0)
    return;
  if (binding_decode (sector + STORE_BINDING_OFFSET, &b) < 0) {
    printf ("binding: damaged (checksum mismatch)\n");
    return;
  }
  if (!b.present) {
    printf ("binding: none (written by the kernel or an older snapfg)\n");
    return;
  }
  printf ("binding: snapshot %s, uuid %s, %s, state %s, created %" PRIi64
          "\n", b.name, b.uuid, binding_mode_name (b.mode),
          binding_state_name (b.state), b.created);
  printf ("binding origin: %s (%" PRIu64 " bytes)\n", b.origin_path,
          b.origin_size);
  if (b.catalogue_id[0])
    printf ("binding catalogue: %s\n", b.catalogue_id);
}

static int
cmd_inspect (int argc, char *argv[])
{
  static const struct option long_options[] = {
    { "exceptions", no_argument, NULL, 'e' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  struct inspect_state is = { .print = false };
  struct snapfg_device dev;
  struct dm_header h;
  enum dm_header_kind kind;
  struct dm_load_result res;
  char why[256];
  const char *path;
  uint32_t chunk_size;
  uint64_t sectors_per_chunk, total;
  int c, r;

  optind = 0;                   /* 0: reinitialise getopt fully */
  while ((c = getopt_long (argc, argv, "eh", long_options, NULL)) != -1) {
    switch (c) {
    case 'e': is.print = true; break;
    case 'h': usage (stdout); return 0;
    default: usage (stderr); return 2;
    }
  }
  if (optind != argc - 1) {
    usage (stderr);
    return 2;
  }
  path = argv[optind];

  r = device_open (&dev, path, true);
  if (r == -EINVAL) {
    fprintf (stderr, "snapfgctl: %s: not a regular file or block device\n",
             path);
    return 1;
  }
  if (r < 0) {
    fprintf (stderr, "snapfgctl: %s: %s\n", path, strerror (-r));
    return 1;
  }
  r = dm_read_header (&dev, &h, &kind, why, sizeof why);
  if (r < 0) {
    fprintf (stderr, "snapfgctl: %s: %s\n", path, why);
    device_close (&dev);
    return 1;
  }
  printf ("COW store: %s (%" PRIu64 " bytes)\n", path, dev.size);
  if (kind == DM_HEADER_EMPTY) {
    printf ("empty: all zero, no header; a new snapshot would start here\n");
    device_close (&dev);
    return 0;
  }
  chunk_size = h.chunk_sectors * 512;
  sectors_per_chunk = h.chunk_sectors;
  printf ("magic: 0x%08" PRIx32 " (SnAp)\n", h.magic);
  printf ("valid: %" PRIu32 "\n", h.valid);
  printf ("version: %" PRIu32 "\n", h.version);
  printf ("chunk size: %" PRIu32 " sectors (%" PRIu32 " bytes)\n",
          h.chunk_sectors, chunk_size);
  printf ("pairs per metadata area: %" PRIu64 "\n",
          dm_pairs_per_area (chunk_size));
  print_binding (&dev, &h);
  total = dev.size / chunk_size * sectors_per_chunk;
  if (h.valid == 0) {
    /* dm does not read the table of an Invalid snapshot either. */
    printf ("status: Invalid\n");
    device_close (&dev);
    return 0;
  }

  if (exception_table_init (&is.seen, 8) < 0) {
    fprintf (stderr, "snapfgctl: out of memory\n");
    device_close (&dev);
    return 1;
  }
  if (is.print)
    printf ("exceptions (old_chunk new_chunk):\n");
  r = dm_load_exceptions (&dev, chunk_size, 0, inspect_pair, &is, &res,
                          why, sizeof why);
  exception_table_destroy (&is.seen);
  device_close (&dev);
  if (r < 0) {
    fflush (stdout);
    fprintf (stderr, "snapfgctl: %s: corrupt store: %s\n", path, why);
    return 1;
  }
  printf ("exceptions: %" PRIu64 "\n", res.exceptions);
  printf ("metadata areas: %" PRIu64 "\n", res.current_area + 1);
  printf ("next free chunk: %" PRIu64 "\n", res.next_free);
  /* As dmsetup status prints it, with the file's size as the total. */
  printf ("status: %" PRIu64 "/%" PRIu64 " %" PRIu64 "\n",
          res.next_free * sectors_per_chunk, total,
          (res.current_area + 2) * sectors_per_chunk);
  return 0;
}

/* --- talking to a running server --- */

/* A size with an optional K/M/G/T suffix (powers of 1024). */
static int
parse_size (const char *what, const char *str, uint64_t *out)
{
  char *end;
  unsigned long long v;
  int shift = 0;

  errno = 0;
  v = strtoull (str, &end, 10);
  if (errno || end == str || str[0] == '-')
    goto bad;
  switch (*end) {
  case '\0': break;
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  case 't': case 'T': shift = 40; end++; break;
  default: goto bad;
  }
  if (*end != '\0' || v == 0 || (shift && v > (UINT64_MAX >> shift)))
    goto bad;
  *out = (uint64_t) v << shift;
  return 0;
 bad:
  fprintf (stderr, "snapfgctl: %s: not a valid size: %s\n", what, str);
  return -1;
}

/* Send one request line, read one reply line (malloc'd). */
static char *
transact (const char *socket_path, const char *request)
{
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  struct json_buf reply = { 0 };
  size_t len = strlen (request);
  int fd;

  if (strlen (socket_path) >= sizeof addr.sun_path) {
    fprintf (stderr, "snapfgctl: %s: socket path too long\n", socket_path);
    return NULL;
  }
  strcpy (addr.sun_path, socket_path);
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1 || connect (fd, (struct sockaddr *) &addr, sizeof addr) == -1) {
    fprintf (stderr, "snapfgctl: cannot connect to %s: %m\n", socket_path);
    if (fd >= 0)
      close (fd);
    return NULL;
  }
  for (size_t off = 0; off < len; ) {
    ssize_t n = write (fd, request + off, len - off);
    if (n == -1) {
      if (errno == EINTR)
        continue;
      fprintf (stderr, "snapfgctl: writing to %s: %m\n", socket_path);
      close (fd);
      return NULL;
    }
    off += n;
  }
  for (;;) {
    char buf[4096];
    ssize_t n = read (fd, buf, sizeof buf - 1);
    if (n == -1 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    buf[n] = '\0';
    json_raw (&reply, buf);
    if (memchr (buf, '\n', n))
      break;
  }
  close (fd);
  if (reply.len == 0 || reply.failed) {
    fprintf (stderr, "snapfgctl: no reply from %s\n", socket_path);
    json_buf_free (&reply);
    return NULL;
  }
  return reply.data;
}

static uint64_t
get_u64 (const struct json_value *obj, const char *key)
{
  const struct json_value *v = json_get (obj, key);

  return v && v->type == JSON_NUMBER && v->is_integer ? v->integer : 0;
}

static double
get_double (const struct json_value *obj, const char *key)
{
  const struct json_value *v = json_get (obj, key);

  return v && v->type == JSON_NUMBER ? v->number : 0;
}

static const char *
get_str (const struct json_value *obj, const char *key)
{
  const char *s = json_get_string (obj, key);

  return s ? s : "";
}

static void
print_snapshot (const struct json_value *sn)
{
  printf ("%s: %s, %s", get_str (sn, "name"), get_str (sn, "state"),
          get_str (sn, "status"));
  printf ("; %s store, chunk %" PRIu64 ", COW %s; %" PRIu64 " exceptions, "
          "%" PRIu64 " connections", get_str (sn, "store"),
          get_u64 (sn, "chunk_size"), get_str (sn, "cow"),
          get_u64 (sn, "exceptions"), get_u64 (sn, "connections"));
  if (json_get (sn, "merge_total"))
    printf ("; merged %" PRIu64 " of %" PRIu64 " chunks",
            get_u64 (sn, "merge_done"), get_u64 (sn, "merge_total"));
  printf ("\n");
}

static void
print_human (const char *cmd, const struct json_value *r)
{
  const struct json_value *a;

  if (strcmp (cmd, "status") == 0) {
    const struct json_value *o = json_get (r, "origin");
    if (o)
      printf ("origin: %s, %" PRIu64 " bytes, block size %" PRIu64 ", %"
              PRIu64 " connections\n", get_str (o, "path"),
              get_u64 (o, "size"), get_u64 (o, "block_size"),
              get_u64 (o, "connections"));
    a = json_get (r, "snapshots");
    for (size_t i = 0; a && i < a->count; ++i)
      print_snapshot (a->items[i]);
  }
  else if (strcmp (cmd, "list") == 0) {
    printf ("origin\n");
    a = json_get (r, "snapshots");
    for (size_t i = 0; a && i < a->count; ++i)
      printf ("%s\t%s\t%s\n", get_str (a->items[i], "name"),
              get_str (a->items[i], "state"),
              get_str (a->items[i], "status"));
  }
  else if (strcmp (cmd, "checkpoint-list") == 0) {
    a = json_get (r, "checkpoints");
    for (size_t i = 0; a && i < a->count; ++i) {
      const struct json_value *x = a->items[i];
      const char *snap = json_get_string (x, "snapshot");

      printf ("%s\t%s\tseq %" PRIu64 "\tgranularity %" PRIu64 "\t%" PRIu64
              " bytes dirty\tcreated %" PRIu64 "%s%s\n", get_str (x, "name"),
              get_str (x, "state"), get_u64 (x, "seq"),
              get_u64 (x, "granularity"), get_u64 (x, "dirty_bytes"),
              get_u64 (x, "created"), snap ? "\tsnapshot " : "",
              snap ? snap : "");
    }
  }
  else if (strcmp (cmd, "changed") == 0) {
    a = json_get (r, "ranges");
    for (size_t i = 0; a && i < a->count; ++i)
      printf ("%" PRIu64 " %" PRIu64 "\n", get_u64 (a->items[i], "offset"),
              get_u64 (a->items[i], "length"));
    printf ("# %zu ranges, %" PRIu64 " bytes changed\n", a ? a->count : 0,
            get_u64 (r, "bytes"));
  }
  else if (strcmp (cmd, "stats") == 0) {
    printf ("%-12s %5s %10s %12s %12s %9s %12s %10s %9s %9s %10s %10s\n",
            "export", "conns", "requests", "bytes-read", "bytes-written",
            "copy-outs", "bytes-copied", "exceptions", "pending", "contended",
            "p50-us", "p99-us");
    a = json_get (r, "exports");
    for (size_t i = 0; a && i < a->count; ++i) {
      const struct json_value *x = a->items[i];
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
  }
  /* create, drop, set-block-size, merge: success says nothing. */
}

static int
need_args (const char *cmd, int have, int want_min, int want_max)
{
  if (have < want_min || have > want_max) {
    fprintf (stderr, "snapfgctl: %s: wrong number of arguments "
             "(see snapfgctl --help)\n", cmd);
    return -1;
  }
  return 0;
}

/* Build the request for argv (the command and its arguments). */
static int
build_request (int argc, char *argv[], struct json_buf *req)
{
  const char *cmd = argv[0];

  json_raw (req, "{");
  json_key (req, "cmd", true);
  json_string (req, cmd);
  if (strcmp (cmd, "status") == 0) {
    if (need_args (cmd, argc - 1, 0, 1) < 0)
      return -1;
    if (argc == 2) {
      json_key (req, "name", false);
      json_string (req, argv[1]);
    }
  }
  else if (strcmp (cmd, "list") == 0 || strcmp (cmd, "stats") == 0) {
    if (need_args (cmd, argc - 1, 0, 0) < 0)
      return -1;
  }
  else if (strcmp (cmd, "changed") == 0 && argc > 1 &&
           strncmp (argv[1], "--since", 7) == 0) {
    /* changed --since CKPT [SNAPSHOT] (or --since=CKPT). */
    const char *since;
    int i = 2;

    if (argv[1][7] == '=')
      since = argv[1] + 8;
    else if (argv[1][7] == '\0' && argc > 2)
      since = argv[i++];
    else {
      fprintf (stderr, "snapfgctl: usage: changed --since CHECKPOINT "
               "[SNAPSHOT]\n");
      return -1;
    }
    if (*since == '\0' || argc - i > 1) {
      fprintf (stderr, "snapfgctl: usage: changed --since CHECKPOINT "
               "[SNAPSHOT]\n");
      return -1;
    }
    json_key (req, "since", false);
    json_string (req, since);
    if (i < argc) {
      json_key (req, "name", false);
      json_string (req, argv[i]);
    }
  }
  else if (strcmp (cmd, "checkpoint") == 0) {
    const char *sub = argc > 1 ? argv[1] : "";

    /* The protocol's command is checkpoint-SUB; rewrite what we sent. */
    json_buf_free (req);
    memset (req, 0, sizeof *req);
    json_raw (req, "{");
    json_key (req, "cmd", true);
    if (strcmp (sub, "list") == 0) {
      if (need_args ("checkpoint list", argc - 2, 0, 0) < 0)
        return -1;
      json_string (req, "checkpoint-list");
    }
    else if (strcmp (sub, "create") == 0 || strcmp (sub, "drop") == 0) {
      if (need_args (strcmp (sub, "create") == 0 ? "checkpoint create"
                     : "checkpoint drop", argc - 2, 1, 1) < 0)
        return -1;
      json_string (req, strcmp (sub, "create") == 0 ? "checkpoint-create"
                   : "checkpoint-drop");
      json_key (req, "name", false);
      json_string (req, argv[2]);
    }
    else {
      fprintf (stderr, "snapfgctl: usage: checkpoint create NAME | "
               "checkpoint list | checkpoint drop NAME\n");
      return -1;
    }
  }
  else if (strcmp (cmd, "drop") == 0 || strcmp (cmd, "merge") == 0 ||
           strcmp (cmd, "changed") == 0) {
    if (need_args (cmd, argc - 1, 1, 1) < 0)
      return -1;
    json_key (req, "name", false);
    json_string (req, argv[1]);
  }
  else if (strcmp (cmd, "set-block-size") == 0) {
    uint64_t size;
    if (need_args (cmd, argc - 1, 1, 1) < 0 ||
        parse_size ("set-block-size", argv[1], &size) < 0)
      return -1;
    json_key (req, "block_size", false);
    json_printf (req, "%" PRIu64, size);
  }
  else if (strcmp (cmd, "create") == 0) {
    static const struct option opts[] = {
      { "cow", required_argument, NULL, 'c' },
      { "store", required_argument, NULL, 's' },
      { "chunk-size", required_argument, NULL, 'k' },
      { "cow-size", required_argument, NULL, 'z' },
      { "checkpoint", required_argument, NULL, 'p' },
      { NULL, 0, NULL, 0 },
    };
    const char *cow = NULL, *store = NULL, *name = NULL, *ckpt = NULL;
    uint64_t chunk = 0, cow_size = 0;
    int c;

    /* GNU getopt moves NAME after the options, wherever it was given. */
    optind = 0;                 /* 0: reinitialise getopt fully */
    while ((c = getopt_long (argc, argv, "", opts, NULL)) != -1) {
      switch (c) {
      case 'c': cow = optarg; break;
      case 's': store = optarg; break;
      case 'p': ckpt = optarg; break;
      case 'k':
        if (parse_size ("--chunk-size", optarg, &chunk) < 0)
          return -1;
        break;
      case 'z':
        if (parse_size ("--cow-size", optarg, &cow_size) < 0)
          return -1;
        break;
      default:
        return -1;
      }
    }
    if (optind < argc)
      name = argv[optind++];
    if (name == NULL || optind != argc) {
      fprintf (stderr, "snapfgctl: usage: create NAME [--cow PATH] "
               "[--store persistent|transient] [--chunk-size N] "
               "[--cow-size N] [--checkpoint CKPT]\n");
      return -1;
    }
    json_key (req, "name", false);
    json_string (req, name);
    /* Without --cow, a server with state= keeps the store in its state
     * directory (and one without refuses).
     */
    if (cow == NULL)
      ;
    else if (json_key (req, "cow", false), cow[0] == '/' ||
             device_is_uri (cow))
      json_string (req, cow);
    else {
      /* The server runs in "/": send an absolute path. */
      char cwd[PATH_MAX];
      struct json_buf abs = { 0 };
      if (getcwd (cwd, sizeof cwd) == NULL) {
        fprintf (stderr, "snapfgctl: getcwd: %m\n");
        return -1;
      }
      json_printf (&abs, "%s/%s", cwd, cow);
      json_string (req, abs.data);
      json_buf_free (&abs);
    }
    if (store) {
      json_key (req, "store", false);
      json_string (req, store);
    }
    if (chunk) {
      json_key (req, "chunk_size", false);
      json_printf (req, "%" PRIu64, chunk);
    }
    if (cow_size) {
      json_key (req, "cow_size", false);
      json_printf (req, "%" PRIu64, cow_size);
    }
    if (ckpt) {
      json_key (req, "checkpoint", false);
      json_string (req, ckpt);
    }
  }
  else {
    fprintf (stderr, "snapfgctl: unknown command '%s' (see snapfgctl "
             "--help)\n", cmd);
    return -1;
  }
  json_raw (req, "}\n");
  return req->failed ? -1 : 0;
}

static int
cmd_remote (const char *socket_path, bool json_output, int argc,
            char *argv[])
{
  struct json_buf req = { 0 };
  struct json_value *reply;
  const struct json_value *ok;
  char *line, err[256];
  int status = 1;

  if (build_request (argc, argv, &req) < 0) {
    json_buf_free (&req);
    return 2;
  }
  line = transact (socket_path, req.data);
  json_buf_free (&req);
  if (line == NULL)
    return 1;
  reply = json_parse (line, strcspn (line, "\n"), err, sizeof err);
  if (reply == NULL) {
    fprintf (stderr, "snapfgctl: unreadable reply from %s: %s\n",
             socket_path, err);
    free (line);
    return 1;
  }
  ok = json_get (reply, "ok");
  if (ok && ok->type == JSON_BOOL && ok->boolean) {
    status = 0;
    if (json_output)
      fputs (line, stdout);
    else
      print_human (strcmp (argv[0], "checkpoint") == 0 && argc > 1 &&
                   strcmp (argv[1], "list") == 0 ? "checkpoint-list"
                   : argv[0], reply);
  }
  else {
    if (json_output)
      fputs (line, stdout);
    fprintf (stderr, "snapfgctl: %s\n",
             json_get_string (reply, "error") ? json_get_string (reply, "error")
             : "the server refused the request");
  }
  json_free (reply);
  free (line);
  return status;
}

int
main (int argc, char *argv[])
{
  static const struct option opts[] = {
    { "socket", required_argument, NULL, 'S' },
    { "json", no_argument, NULL, 'j' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  const char *socket_path = NULL;
  bool json_output = false;
  int c;

  /* Options before the command only ("+"): the command has its own. */
  while ((c = getopt_long (argc, argv, "+S:jh", opts, NULL)) != -1) {
    switch (c) {
    case 'S': socket_path = optarg; break;
    case 'j': json_output = true; break;
    case 'h': usage (stdout); return 0;
    default: usage (stderr); return 2;
    }
  }
  if (optind >= argc) {
    usage (stderr);
    return 2;
  }
  if (strcmp (argv[optind], "inspect") == 0)
    return cmd_inspect (argc - optind, argv + optind);
  if (socket_path == NULL) {
    fprintf (stderr, "snapfgctl: %s: give the server's control socket "
             "with -S SOCKET\n", argv[optind]);
    return 2;
  }
  return cmd_remote (socket_path, json_output, argc - optind, argv + optind);
}
