/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: full and incremental backups of a snapfg origin.
 *
 *   snapfg-backup -S CONTROL -u NBD_URI backup DIR [--full]
 *   snapfg-backup restore DIR OUT [--at N] [-O raw|qcow2]
 *
 * A run takes a snapshot and a new checkpoint at one instant (control
 * "create" with "checkpoint"), copies the snapshot (full) or the ranges
 * changed since the previous run's checkpoint up to that instant
 * (incremental, control "changed" with "since" and "name") into a new
 * qcow2 image (an overlay of the previous one for an incremental),
 * drops the snapshot, records the run in DIR/manifest.json and drops the
 * older checkpoint.  See snapfg-backup(1).
 *
 * Order of a run, so that a crash anywhere leaves the chain as it was
 * and the next run correct:
 *   1. the image is written as NNNN-TYPE.qcow2.partial and fsync'd;
 *   2. NNNN.sums is written (tmp, fsync, rename);
 *   3. the manifest naming NNNN-TYPE.qcow2 is made durable;
 *   4. the .partial is renamed to its name (a next run or a restore
 *      finishes this rename if a crash came between 3 and 4);
 *   5. the older checkpoint is dropped.
 * Anything of a run that is not in the manifest is a leftover: the next
 * run removes it (files, snapshots and checkpoints carrying this
 * directory's chain id).
 */

#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "rounding.h"
#include "snapfg-backup.h"

#define MAX_SOURCES 4           /* connections to the snapshot (multi-conn) */
#define NAME_PREFIX "snapfg-backup-"

volatile sig_atomic_t backup_interrupted;

extern void copy_end_progress_line (void);

void
backup_error (const char *fmt, ...)
{
  va_list ap;

  copy_end_progress_line ();
  fputs ("snapfg-backup: ", stderr);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
}

void
backup_info (const char *fmt, ...)
{
  va_list ap;

  copy_end_progress_line ();
  fputs ("snapfg-backup: ", stderr);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
}

static void
on_signal (int sig)
{
  backup_interrupted = 1;
}

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: snapfg-backup -S CONTROL -u NBD_URI backup DIR [--full]\n"
           "       snapfg-backup restore DIR OUT [--at N] [-O raw|qcow2]\n"
           "\n"
           "  backup DIR       back up the server's origin into DIR: a full\n"
           "                   qcow2 image the first time, then incremental\n"
           "                   overlays of the ranges changed since the last run\n"
           "  restore DIR OUT  write the disk as it was at run N (default:\n"
           "                   the latest) to OUT, a new file\n"
           "\n"
           "  -S, --socket=CONTROL   the server's control socket (control=)\n"
           "  -u, --uri=NBD_URI      the server, e.g. nbd+unix:///?socket=S,\n"
           "                         nbd://host:port/, nbds://host/?tls-psk-file=F\n"
           "  --full                 a full backup even if DIR has a chain\n"
           "  --cow-dir=DIR          the snapshot's COW store goes here, not in\n"
           "                         the server's state directory\n"
           "  --at=N                 restore run N (see DIR/manifest.json)\n"
           "  -O, --output-format=raw|qcow2   restore's format (default raw)\n"
           "  -h, --help, -V, --version\n"
           "\n"
           "Exit status: 0 done, 1 failed, 2 usage error, 3 an incremental\n"
           "is impossible (run with --full).\n");
}

/* --- small helpers --- */

/* Run ARGV (no shell) with stdout to /dev/null; in DIR if not NULL. */
static int
run_command (const char *dir, char *const argv[])
{
  pid_t pid;
  int st;

  fflush (stderr);
  pid = fork ();
  if (pid == -1) {
    backup_error ("fork: %m");
    return -1;
  }
  if (pid == 0) {
    int fd = open ("/dev/null", O_WRONLY);
    if (fd >= 0) {
      dup2 (fd, 1);
      close (fd);
    }
    if (dir && chdir (dir) == -1) {
      fprintf (stderr, "snapfg-backup: %s: %m\n", dir);
      _exit (127);
    }
    execvp (argv[0], argv);
    fprintf (stderr, "snapfg-backup: cannot run %s: %m (install qemu-utils)\n",
             argv[0]);
    _exit (127);
  }
  while (waitpid (pid, &st, 0) == -1)
    if (errno != EINTR) {
      backup_error ("waitpid: %m");
      return -1;
    }
  if (!WIFEXITED (st) || WEXITSTATUS (st) != 0) {
    backup_error ("%s failed (%s %d)", argv[0],
                  WIFEXITED (st) ? "exit status" : "signal",
                  WIFEXITED (st) ? WEXITSTATUS (st) : WTERMSIG (st));
    return -1;
  }
  return 0;
}

static int
fsync_file (int dirfd, const char *name)
{
  int fd = openat (dirfd, name, O_RDONLY | O_CLOEXEC);
  int r;

  if (fd == -1)
    return -1;
  r = fsync (fd);
  close (fd);
  return r;
}

static void
iso_time (time_t t, char out[32])
{
  struct tm tm;

  gmtime_r (&t, &tm);
  strftime (out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static uint64_t
json_u64 (json_t *obj, const char *key)
{
  json_int_t v = json_integer_value (json_object_get (obj, key));

  return v > 0 ? (uint64_t) v : 0;
}

static const char *
json_str (json_t *obj, const char *key)
{
  return json_string_value (json_object_get (obj, key));
}

/* The checksum block: 64K, doubled until the disk has at most 2^20
 * blocks, so that the sums of a large disk still fit in memory.
 */
static uint64_t
sum_block_for (uint64_t size)
{
  uint64_t b = 65536;

  while (div_round_up (size, b) > (1 << 20))
    b *= 2;
  return b;
}

/* Sort and merge ranges, rounding each out to BLOCK. */
static int
cmp_range (const void *a, const void *b)
{
  const struct copy_range *x = a, *y = b;

  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static size_t
normalise_ranges (struct copy_range *r, size_t n, uint64_t block,
                  uint64_t size)
{
  size_t out = 0;

  for (size_t i = 0; i < n; ++i) {
    uint64_t start = r[i].offset / block * block;
    uint64_t end = r[i].offset + r[i].length;
    end = div_round_up (end, block) * block;
    if (end > size)
      end = size;
    r[i].offset = start;
    r[i].length = end > start ? end - start : 0;
  }
  qsort (r, n, sizeof *r, cmp_range);
  for (size_t i = 0; i < n; ++i) {
    if (r[i].length == 0)
      continue;
    if (out > 0 && r[out - 1].offset + r[out - 1].length >= r[i].offset) {
      uint64_t end = r[i].offset + r[i].length;
      if (end > r[out - 1].offset + r[out - 1].length)
        r[out - 1].length = end - r[out - 1].offset;
    }
    else
      r[out++] = r[i];
  }
  return out;
}

/* --- NBD connections --- */

/* Connect to the server named by URI and stop in option mode, before
 * an export is chosen: the URI names the server, TLS and its files
 * (tls-psk-file=); the export is ours, set by open_export.  Connecting
 * first lets a run fail before it changes anything on the server.
 */
static struct nbd_handle *
connect_server (const char *uri, bool want_extents)
{
  struct nbd_handle *h = nbd_create ();

  if (h == NULL) {
    backup_error ("%s", nbd_get_error ());
    return NULL;
  }
  if (nbd_set_opt_mode (h, true) == -1 ||
      nbd_set_uri_allow_local_file (h, true) == -1 ||
      (want_extents &&
       nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1) ||
      nbd_connect_uri (h, uri) == -1) {
    backup_error ("cannot connect to %s: %s", uri, nbd_get_error ());
    nbd_close (h);
    return NULL;
  }
  return h;
}

/* Finish negotiating: serve EXPORT (the URI's own export is replaced). */
static int
open_export (struct nbd_handle *h, const char *uri, const char *export)
{
  if (nbd_set_export_name (h, export) == -1 || nbd_opt_go (h) == -1) {
    backup_error ("%s: cannot open export '%s': %s", uri, export,
                  nbd_get_error ());
    return -1;
  }
  return 0;
}

static struct nbd_handle *
connect_export (const char *uri, const char *export)
{
  struct nbd_handle *h = connect_server (uri, false);

  if (h && open_export (h, uri, export) == -1) {
    nbd_opt_abort (h);
    nbd_close (h);
    return NULL;
  }
  return h;
}

static void
disconnect (struct nbd_handle *h)
{
  if (h) {
    if (nbd_aio_is_negotiating (h))
      nbd_opt_abort (h);
    else
      nbd_shutdown (h, 0);
    nbd_close (h);
  }
}

/* A local image through qemu-nbd, started by socket activation. */
static struct nbd_handle *
open_image (const char *path, const char *format, bool readonly)
{
  struct nbd_handle *h = nbd_create ();
  char *argv[] = { "qemu-nbd", "-f", (char *) format,
                   readonly ? "-r" : "--cache=writeback", (char *) path, NULL };

  if (h == NULL) {
    backup_error ("%s", nbd_get_error ());
    return NULL;
  }
  if ((readonly &&
       nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1) ||
      nbd_connect_systemd_socket_activation (h, argv) == -1) {
    backup_error ("%s: cannot open it with qemu-nbd: %s", path,
                  nbd_get_error ());
    nbd_close (h);
    return NULL;
  }
  return h;
}

struct extent_acc {
  struct copy_range *r;
  size_t n, cap;
  uint64_t next;                /* offset after the last extent seen */
  bool failed;
};

static int
extent_cb (void *opaque, const char *context, uint64_t offset,
           uint32_t *entries, size_t nr, int *error)
{
  struct extent_acc *a = opaque;

  if (strcmp (context, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0)
    return 0;
  for (size_t i = 0; i + 1 < nr; i += 2) {
    uint32_t len = entries[i], flags = entries[i + 1];
    if (!(flags & LIBNBD_STATE_ZERO)) {
      if (a->n == a->cap) {
        struct copy_range *p = realloc (a->r, (a->cap * 2 + 64) * sizeof *p);
        if (p == NULL) {
          a->failed = true;
          return -1;
        }
        a->r = p;
        a->cap = a->cap * 2 + 64;
      }
      a->r[a->n++] = (struct copy_range) { offset, len };
    }
    offset += len;
  }
  a->next = offset;
  return 0;
}

/* The ranges of H that may hold data (not known to read as zero),
 * rounded out to BLOCK; the whole disk if the server cannot tell.
 */
static int
data_ranges (struct nbd_handle *h, uint64_t size, uint64_t block,
             struct copy_range **out, size_t *nout)
{
  struct extent_acc a = { NULL, 0, 0, 0, false };

  if (nbd_can_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) != 1) {
    a.r = malloc (sizeof *a.r);
    if (a.r == NULL)
      return -1;
    a.r[0] = (struct copy_range) { 0, size };
    *out = a.r;
    *nout = size ? 1 : 0;
    return 0;
  }
  for (uint64_t off = 0; off < size; ) {
    uint64_t count = size - off > (1 << 30) ? (1 << 30) : size - off;
    a.next = off;
    if (nbd_block_status (h, count, off,
                          (nbd_extent_callback) { .callback = extent_cb,
                                                  .user_data = &a }, 0) == -1
        || a.failed) {
      backup_error ("block status at offset %" PRIu64 ": %s", off,
                    a.failed ? "out of memory" : nbd_get_error ());
      free (a.r);
      return -1;
    }
    if (a.next <= off) {
      backup_error ("block status at offset %" PRIu64 ": the server "
                    "described no extent", off);
      free (a.r);
      return -1;
    }
    off = a.next;
  }
  *nout = normalise_ranges (a.r, a.n, block, size);
  *out = a.r;
  return 0;
}

/* --- the backup directory --- */

struct backup_dir {
  const char *path;
  int fd;
  int lock_fd;
};

static int
open_backup_dir (const char *path, bool create, struct backup_dir *d)
{
  d->path = path;
  d->lock_fd = -1;
  if (create && mkdir (path, 0755) == -1 && errno != EEXIST) {
    backup_error ("%s: cannot create the backup directory: %m", path);
    return -1;
  }
  d->fd = open (path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d->fd == -1) {
    backup_error ("%s: %m", path);
    return -1;
  }
  return 0;
}

/* Only one run at a time in a directory. */
static int
lock_backup_dir (struct backup_dir *d)
{
  d->lock_fd = openat (d->fd, ".lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (d->lock_fd == -1) {
    backup_error ("%s/.lock: %m", d->path);
    return -1;
  }
  if (flock (d->lock_fd, LOCK_EX | LOCK_NB) == -1) {
    backup_error ("%s: another snapfg-backup is running on this directory",
                  d->path);
    return -1;
  }
  return 0;
}

/* Names snapfg-backup writes, and the run number they carry:
 * NNNN-full.qcow2[.partial], NNNN-incr.qcow2[.partial], NNNN.sums[.tmp].
 */
static bool
our_file (const char *name, unsigned *seq, bool *partial)
{
  unsigned n;
  int len = 0;

  *partial = false;
  if (sscanf (name, "%u%n", &n, &len) != 1 || len < 4)
    return false;
  name += len;
  *seq = n;
  if (strcmp (name, "-full.qcow2") == 0 || strcmp (name, "-incr.qcow2") == 0 ||
      strcmp (name, ".sums") == 0)
    return true;
  if (strcmp (name, "-full.qcow2.partial") == 0 ||
      strcmp (name, "-incr.qcow2.partial") == 0 ||
      strcmp (name, ".sums.tmp") == 0) {
    *partial = true;
    return true;
  }
  return false;
}

/* An empty directory, or one holding only leftovers of an interrupted
 * first run, may start a chain; anything else is not ours to touch.
 */
static int
check_new_dir (struct backup_dir *d)
{
  DIR *dp = fdopendir (dup (d->fd));
  struct dirent *e;
  int r = 0;

  if (dp == NULL) {
    backup_error ("%s: %m", d->path);
    return -1;
  }
  while ((e = readdir (dp)) != NULL) {
    unsigned seq;
    bool partial;
    if (strcmp (e->d_name, ".") == 0 || strcmp (e->d_name, "..") == 0 ||
        strcmp (e->d_name, ".lock") == 0 ||
        strcmp (e->d_name, "lost+found") == 0 ||
        strcmp (e->d_name, "manifest.json.tmp") == 0 ||
        (our_file (e->d_name, &seq, &partial) && (partial ||
                                                 strstr (e->d_name, ".sums"))))
      continue;
    backup_error ("%s: not empty and has no manifest.json (found %s): "
                  "give an empty or new directory", d->path, e->d_name);
    r = -1;
    break;
  }
  closedir (dp);
  return r;
}

/* Remove what interrupted runs left, finish a rename a crash cut short. */
static int
clean_leftovers (struct backup_dir *d, json_t *last)
{
  unsigned last_seq = last ? json_u64 (last, "seq") : 0;
  const char *last_image = last ? json_str (last, "image") : NULL;
  DIR *dp;
  struct dirent *e;
  char partial[NAME_MAX + 1];

  /* The manifest names the last image: if only its .partial exists, the
   * run was complete and durable when it stopped.
   */
  if (last_image && faccessat (d->fd, last_image, F_OK, 0) == -1) {
    snprintf (partial, sizeof partial, "%s.partial", last_image);
    if (renameat (d->fd, partial, d->fd, last_image) == -1) {
      backup_error ("%s/%s (run %u in the manifest) is missing: the chain "
                    "is broken; start a new one with --full in an empty "
                    "directory", d->path, last_image, last_seq);
      return -1;
    }
    fsync_dir (d->fd);
    backup_info ("finished the interrupted rename of %s", last_image);
  }

  dp = fdopendir (dup (d->fd));
  if (dp == NULL) {
    backup_error ("%s: %m", d->path);
    return -1;
  }
  while ((e = readdir (dp)) != NULL) {
    unsigned seq;
    bool is_partial, ours = our_file (e->d_name, &seq, &is_partial);
    bool is_sums = ours && strstr (e->d_name, ".sums") != NULL;

    /* An interrupted run leaves temporary files, and sums (written
     * before the manifest).  A finished image the manifest does not
     * know never comes from a crash: it is not ours to remove, and the
     * run would replace it.
     */
    if (ours && !is_partial && !is_sums && seq > last_seq) {
      backup_error ("%s/%s is not in the manifest (its last run is %u): "
                    "move it out of the way", d->path, e->d_name, last_seq);
      closedir (dp);
      return -1;
    }
    if (strcmp (e->d_name, "manifest.json.tmp") == 0 ||
        (ours && (is_partial || (is_sums && seq > last_seq)))) {
      if (unlinkat (d->fd, e->d_name, 0) == 0)
        backup_info ("removed %s, left by an interrupted run", e->d_name);
    }
  }
  closedir (dp);
  return 0;
}

/* --- backup --- */

struct options {
  const char *socket;
  const char *uri;
  const char *cow_dir;
  bool full;
  long at;
  const char *format;
};

/* Drop a snapshot; with --cow-dir remove its store too. */
static int
drop_snapshot (const struct options *o, const char *name)
{
  json_t *req = json_pack ("{s:s, s:s}", "cmd", "drop", "name", name);
  json_t *reply;
  char err[512];

  reply = control_call (o->socket, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("dropping snapshot %s: %s", name, err);
    return -1;
  }
  json_decref (reply);
  if (o->cow_dir) {
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s/%s.cow", o->cow_dir, name);
    unlink (path);
  }
  return 0;
}

static int
drop_checkpoint (const struct options *o, const char *name)
{
  json_t *req = json_pack ("{s:s, s:s}", "cmd", "checkpoint-drop",
                           "name", name);
  json_t *reply;
  char err[512];

  reply = control_call (o->socket, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("warning: dropping checkpoint %s: %s", name, err);
    return -1;
  }
  json_decref (reply);
  return 0;
}

/* Names of the server's snapshots or checkpoints that start with PREFIX. */
static json_t *
server_names (const struct options *o, const char *cmd, const char *key,
              const char *prefix)
{
  json_t *req = json_pack ("{s:s}", "cmd", cmd);
  json_t *reply, *out = json_array (), *v;
  char err[512];
  size_t i;

  reply = control_call (o->socket, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL)
    return out;
  json_array_foreach (json_object_get (reply, key), i, v) {
    const char *n = json_str (v, "name");
    if (n && strncmp (n, prefix, strlen (prefix)) == 0)
      json_array_append_new (out, json_string (n));
  }
  json_decref (reply);
  return out;
}

static int
cmd_backup (const struct options *o, const char *dir_path)
{
  struct backup_dir d;
  json_t *manifest = NULL, *runs, *last = NULL, *req, *reply, *run, *v;
  json_t *stale_ckpts = NULL;
  struct nbd_handle *src[MAX_SOURCES] = { NULL }, *dst = NULL;
  size_t nsrc = 0, nranges = 0, i;
  struct copy_range *ranges = NULL;
  struct copy_job job;
  unsigned char *sums = NULL, copied_sum[SHA256_LEN], disk_sum[SHA256_LEN];
  char err[1024], prefix[64], name[96], image[64], partial[80], sums_name[32];
  char hex1[65], hex2[65], when[32], cow_path[PATH_MAX];
  const char *since = NULL, *prev_image = NULL;
  bool missing, incremental, snapshot_made = false, recorded = false;
  bool checkpoint_made = false;
  uint64_t size, block;
  unsigned seq;
  time_t started, finished;
  int status = EXIT_FAILED;
  char *stop_env;

  partial[0] = '\0';
  if (open_backup_dir (dir_path, true, &d) == -1 || lock_backup_dir (&d) == -1)
    return EXIT_FAILED;

  manifest = manifest_read (d.fd, dir_path, &missing, err, sizeof err);
  if (manifest == NULL && !missing) {
    backup_error ("%s", err);
    goto out;
  }
  if (manifest == NULL) {
    unsigned char id[4];
    char idhex[9];
    if (check_new_dir (&d) == -1)
      goto out;
    if (getrandom (id, sizeof id, 0) != sizeof id) {
      backup_error ("getrandom: %m");
      goto out;
    }
    snprintf (idhex, sizeof idhex, "%02x%02x%02x%02x", id[0], id[1], id[2],
              id[3]);
    manifest = json_pack ("{s:s, s:i, s:s, s:[]}",
                          "format", "snapfg-backup-manifest", "version", 1,
                          "chain_id", idhex, "runs");
  }
  runs = json_object_get (manifest, "runs");
  if (json_array_size (runs) > 0)
    last = json_array_get (runs, json_array_size (runs) - 1);
  if (clean_leftovers (&d, last) == -1)
    goto out;
  seq = last ? json_u64 (last, "seq") + 1 : 1;
  incremental = last && !o->full;
  snprintf (prefix, sizeof prefix, NAME_PREFIX "%s-",
            json_str (manifest, "chain_id"));

  /* The origin's size, and snapshots left by interrupted runs. */
  req = json_pack ("{s:s}", "cmd", "status");
  reply = control_call (o->socket, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("%s", err);
    goto out;
  }
  size = json_u64 (json_object_get (reply, "origin"), "size");
  json_array_foreach (json_object_get (reply, "snapshots"), i, v) {
    const char *n = json_str (v, "name");
    if (n && strncmp (n, prefix, strlen (prefix)) == 0) {
      backup_info ("dropping snapshot %s, left by an interrupted run", n);
      drop_snapshot (o, n);
    }
  }
  json_decref (reply);
  if (size == 0) {
    backup_error ("the server reports an empty origin: nothing to back up");
    goto out;
  }

  if (incremental) {
    since = json_str (last, "checkpoint");
    prev_image = json_str (last, "image");
    block = json_u64 (last, "sum_block");
    if (json_u64 (last, "size") != size) {
      backup_error ("the origin's size changed since run %u (%" PRIu64
                    " bytes, now %" PRIu64 "): an incremental is impossible; "
                    "run with --full", seq - 1, json_u64 (last, "size"), size);
      status = EXIT_NEED_FULL;
      goto out;
    }
    sums = sums_read (d.fd, json_str (last, "sums"), block, size,
                      err, sizeof err);
    if (sums == NULL) {
      backup_error ("%s/%s: %s; an incremental needs the previous run's "
                    "sums: run with --full", dir_path,
                    json_str (last, "sums") ? json_str (last, "sums") : "?",
                    err);
      status = EXIT_NEED_FULL;
      goto out;
    }
  }
  else {
    block = sum_block_for (size);
    sums = malloc (div_round_up (size, block) * SHA256_LEN + 1);
    if (sums == NULL) {
      backup_error ("out of memory");
      goto out;
    }
    /* Blocks the copy skips (holes) read as zero. */
    {
      unsigned char z[SHA256_LEN], zl[SHA256_LEN];
      uint64_t nb = div_round_up (size, block);
      sha256_zero (block, z);
      sha256_zero (size - (nb - 1) * block, zl);
      for (uint64_t b = 0; b < nb; ++b)
        memcpy (sums + b * SHA256_LEN, b == nb - 1 ? zl : z, SHA256_LEN);
    }
  }
  /* Checkpoints of this chain other than the one the manifest names are
   * leftovers; they are dropped once this run is recorded (dropping
   * them now could only matter to an older checkpoint, and keeping them
   * until then keeps "changed since" exact whatever the server does).
   */
  stale_ckpts = server_names (o, "checkpoint-list", "checkpoints", prefix);

  /* The NBD server must be reachable (address, TLS) before anything is
   * changed on it.
   */
  src[0] = connect_server (o->uri, !incremental);
  if (src[0] == NULL)
    goto out;
  nsrc = 1;

  /* 1. Snapshot and checkpoint at one instant. */
  {
    unsigned char rnd[2];
    if (getrandom (rnd, sizeof rnd, 0) != sizeof rnd) {
      backup_error ("getrandom: %m");
      goto out;
    }
    snprintf (name, sizeof name, "%s%04u-%02x%02x", prefix, seq, rnd[0],
              rnd[1]);
  }
  snprintf (image, sizeof image, "%04u-%s.qcow2", seq,
            incremental ? "incr" : "full");
  snprintf (partial, sizeof partial, "%s.partial", image);
  snprintf (sums_name, sizeof sums_name, "%04u.sums", seq);
  req = json_pack ("{s:s, s:s, s:s}", "cmd", "create", "name", name,
                   "checkpoint", name);
  if (o->cow_dir) {
    snprintf (cow_path, sizeof cow_path, "%s/%s.cow", o->cow_dir, name);
    json_object_set_new (req, "cow", json_string (cow_path));
  }
  started = time (NULL);
  reply = control_call (o->socket, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("creating snapshot and checkpoint %s: %s (snapfg-backup "
                  "needs a server started with state=FILE and control=SOCKET)",
                  name, err);
    goto out;
  }
  json_decref (reply);
  snapshot_made = checkpoint_made = true;

  /* 2. What to copy. */
  if (open_export (src[0], o->uri, name) == -1)
    goto out;
  if ((uint64_t) nbd_get_size (src[0]) != size) {
    backup_error ("export %s: %" PRId64 " bytes, the origin %" PRIu64,
                  name, nbd_get_size (src[0]), size);
    goto out;
  }
  if (incremental) {
    json_t *a;
    req = json_pack ("{s:s, s:s, s:s}", "cmd", "changed", "since", since,
                     "name", name);
    reply = control_call (o->socket, req, err, sizeof err);
    json_decref (req);
    if (reply == NULL) {
      backup_error ("an incremental backup since checkpoint %s is "
                    "impossible: %s; run with --full", since, err);
      status = EXIT_NEED_FULL;
      goto out;
    }
    a = json_object_get (reply, "ranges");
    ranges = malloc ((json_array_size (a) + 1) * sizeof *ranges);
    if (ranges == NULL) {
      json_decref (reply);
      backup_error ("out of memory");
      goto out;
    }
    json_array_foreach (a, i, v)
      ranges[nranges++] = (struct copy_range) { json_u64 (v, "offset"),
                                                json_u64 (v, "length") };
    json_decref (reply);
    nranges = normalise_ranges (ranges, nranges, block, size);
  }
  else if (data_ranges (src[0], size, block, &ranges, &nranges) == -1)
    goto out;

  /* More connections when the server says they see the same data. */
  if (nbd_can_multi_conn (src[0]) == 1)
    while (nsrc < MAX_SOURCES) {
      src[nsrc] = connect_export (o->uri, name);
      if (src[nsrc] == NULL)
        break;
      nsrc++;
    }

  /* 3. The new image, then the copy. */
  {
    char size_arg[32];
    char *create_full[] = { "qemu-img", "create", "-q", "-f", "qcow2",
                            partial, size_arg, NULL };
    char *create_incr[] = { "qemu-img", "create", "-q", "-f", "qcow2",
                            "-b", (char *) prev_image, "-F", "qcow2",
                            partial, size_arg, NULL };
    char path[PATH_MAX];
    snprintf (size_arg, sizeof size_arg, "%" PRIu64, size);
    if (run_command (dir_path, incremental ? create_incr : create_full) == -1)
      goto out;
    snprintf (path, sizeof path, "%s/%s", dir_path, partial);
    dst = open_image (path, "qcow2", false);
    if (dst == NULL)
      goto out;
    if ((uint64_t) nbd_get_size (dst) != size) {
      backup_error ("%s: qemu-nbd serves %" PRId64 " bytes, expected %"
                    PRIu64, path, nbd_get_size (dst), size);
      goto out;
    }
  }
  memset (&job, 0, sizeof job);
  job.src = src;
  job.nsrc = nsrc;
  job.dst = dst;
  job.ranges = ranges;
  job.nranges = nranges;
  job.size = size;
  job.block = block;
  job.sums = sums;
  job.write_zeroes = incremental;
  job.what = incremental ? "incremental backup" : "full backup";
  stop_env = getenv ("SNAPFG_BACKUP_TEST_STOP_AFTER");
  if (stop_env)
    job.stop_after = strtoull (stop_env, NULL, 10);
  if (copy_run (&job, err, sizeof err) == -1) {
    backup_error ("backup of snapshot %s failed: %s", name, err);
    goto out;
  }
  if (nbd_flush (dst, 0) == -1) {
    backup_error ("%s/%s: flush: %s", dir_path, partial, nbd_get_error ());
    goto out;
  }
  disconnect (dst);             /* waits for qemu-nbd to exit */
  dst = NULL;
  if (fsync_file (d.fd, partial) == -1) {
    backup_error ("%s/%s: fsync: %m", dir_path, partial);
    goto out;
  }

  /* 4. The snapshot has served its purpose. */
  for (i = 0; i < nsrc; ++i)
    disconnect (src[i]);
  nsrc = 0;
  drop_snapshot (o, name);
  snapshot_made = false;
  finished = time (NULL);

  /* 5. Record the run. */
  if (sums_write (d.fd, sums_name, block, size, sums, err, sizeof err) == -1) {
    backup_error ("%s/%s", dir_path, err);
    goto out;
  }
  sums_digest (sums, block, ranges, nranges, size, copied_sum);
  sums_digest (sums, block, NULL, 0, size, disk_sum);
  hex_digest (copied_sum, hex1);
  hex_digest (disk_sum, hex2);
  iso_time (started, when);
  run = json_pack ("{s:i, s:s, s:s, s:s?, s:s, s:s, s:s?, s:s, s:I, s:I,"
                   " s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:s, s:s, s:s}",
                   "seq", (int) seq,
                   "type", incremental ? "incremental" : "full",
                   "image", image,
                   "backing", incremental ? prev_image : NULL,
                   "snapshot", name,
                   "checkpoint", name,
                   "since", incremental ? since : NULL,
                   "time", when,
                   "started", (json_int_t) started,
                   "finished", (json_int_t) finished,
                   "size", (json_int_t) size,
                   "sum_block", (json_int_t) block,
                   "bytes_read", (json_int_t) job.bytes_read,
                   "bytes_copied", (json_int_t) job.bytes_written,
                   "bytes_zeroed", (json_int_t) job.bytes_zeroed,
                   "ranges_bytes", (json_int_t) 0,
                   "ranges", (int) nranges,
                   "sums", sums_name,
                   "copied_sha256", hex1,
                   "disk_sha256", hex2);
  if (run == NULL) {
    backup_error ("out of memory");
    goto out;
  }
  {
    uint64_t rb = 0;
    for (i = 0; i < nranges; ++i)
      rb += ranges[i].length;
    json_object_set_new (run, "ranges_bytes", json_integer (rb));
  }
  json_array_append_new (runs, run);
  if (manifest_write (d.fd, dir_path, manifest, err, sizeof err) == -1) {
    backup_error ("%s", err);
    json_array_remove (runs, json_array_size (runs) - 1);
    goto out;
  }
  recorded = true;
  /* 6. Into the chain. */
  if (renameat (d.fd, partial, d.fd, image) == -1 || fsync_dir (d.fd) == -1) {
    backup_error ("%s/%s: rename to %s: %m (the next run finishes it)",
                  dir_path, partial, image);
    goto out;
  }
  status = EXIT_OK;

  /* 7. Older checkpoints: the one this run started from, and leftovers. */
  if (last)
    drop_checkpoint (o, json_str (last, "checkpoint"));
  json_array_foreach (stale_ckpts, i, v)
    if (!last || strcmp (json_string_value (v),
                         json_str (last, "checkpoint")) != 0)
      drop_checkpoint (o, json_string_value (v));

  backup_info ("run %u: %s backup %s/%s, %" PRIu64 " bytes copied, %"
               PRIu64 " zeroed", seq, incremental ? "incremental" : "full",
               dir_path, image, job.bytes_written, job.bytes_zeroed);

 out:
  if (dst)
    disconnect (dst);
  /* A run that is not in the manifest leaves no image behind. */
  if (status != EXIT_OK && !recorded && partial[0])
    unlinkat (d.fd, partial, 0);
  for (i = 0; i < nsrc; ++i)
    disconnect (src[i]);
  if (snapshot_made)
    drop_snapshot (o, name);
  /* A failed run leaves the server as it found it: without its new
   * checkpoint, the older one tracking again (the server folds the
   * dropped checkpoint's bits into it).  If this fails too, the next
   * run drops it as a leftover.
   */
  if (checkpoint_made && !recorded)
    drop_checkpoint (o, name);
  free (ranges);
  free (sums);
  json_decref (stale_ckpts);
  json_decref (manifest);
  close (d.fd);
  if (d.lock_fd >= 0)
    close (d.lock_fd);
  return status;
}

/* --- restore --- */

static int
cmd_restore (const struct options *o, const char *dir_path, const char *out)
{
  struct backup_dir d;
  json_t *manifest, *runs, *run = NULL, *v;
  char err[1024], image[PATH_MAX], tmp[PATH_MAX];
  struct nbd_handle *h = NULL;
  struct copy_range *ranges = NULL;
  unsigned char *expected = NULL, *got = NULL, digest[SHA256_LEN];
  uint64_t size, block;
  size_t nranges, i;
  bool missing;
  int status = EXIT_FAILED;
  struct stat st;

  if (open_backup_dir (dir_path, false, &d) == -1)
    return EXIT_FAILED;
  manifest = manifest_read (d.fd, dir_path, &missing, err, sizeof err);
  if (manifest == NULL) {
    if (missing)
      backup_error ("%s: no manifest.json: not a snapfg-backup directory",
                    dir_path);
    else
      backup_error ("%s", err);
    close (d.fd);
    return EXIT_FAILED;
  }
  runs = json_object_get (manifest, "runs");
  json_array_foreach (runs, i, v)
    if (o->at < 0 || json_u64 (v, "seq") == (uint64_t) o->at)
      run = v;
  if (run == NULL) {
    if (json_array_size (runs) == 0)
      backup_error ("%s: the manifest records no run yet", dir_path);
    else
      backup_error ("%s: no run %ld (runs %" PRIu64 " to %" PRIu64 ")",
                    dir_path, o->at, json_u64 (json_array_get (runs, 0), "seq"),
                    json_u64 (json_array_get (runs, json_array_size (runs) - 1),
                              "seq"));
    goto done;
  }
  size = json_u64 (run, "size");
  block = json_u64 (run, "sum_block");

  /* A new file, or an empty one (mktemp's): nothing is lost. */
  if (lstat (out, &st) == 0 && !(S_ISREG (st.st_mode) && st.st_size == 0)) {
    backup_error ("%s exists and is not an empty file: restore writes a "
                  "new file; remove it or give another name", out);
    goto done;
  }
  snprintf (image, sizeof image, "%s/%s", dir_path, json_str (run, "image"));
  if (access (image, F_OK) == -1) {
    /* A crash between the manifest and the rename (see the top). */
    strncat (image, ".partial", sizeof image - strlen (image) - 1);
    if (access (image, F_OK) == -1) {
      backup_error ("%s/%s: missing: cannot restore run %" PRIu64, dir_path,
                    json_str (run, "image"), json_u64 (run, "seq"));
      goto done;
    }
  }
  snprintf (tmp, sizeof tmp, "%s.tmp%d", out, (int) getpid ());
  {
    char *argv[] = { "qemu-img", "convert", "-q", "-f", "qcow2", "-O",
                     (char *) o->format, image, tmp, NULL };
    if (run_command (NULL, argv) == -1)
      goto fail;
  }

  /* Check what was written against the run's block sums. */
  expected = sums_read (d.fd, json_str (run, "sums"), block, size,
                        err, sizeof err);
  if (expected) {
    char hex[65];
    sums_digest (expected, block, NULL, 0, size, digest);
    hex_digest (digest, hex);
    if (!json_str (run, "disk_sha256") ||
        strcmp (hex, json_str (run, "disk_sha256")) != 0) {
      backup_error ("%s/%s does not match the manifest's disk_sha256: "
                    "the backup directory is damaged", dir_path,
                    json_str (run, "sums"));
      goto fail;
    }
  }
  else
    backup_info ("warning: not verified (%s)", err);
  if (expected) {
    struct copy_job job;
    uint64_t nb = div_round_up (size, block);
    unsigned char z[SHA256_LEN], zl[SHA256_LEN];

    h = open_image (tmp, o->format, true);
    if (h == NULL)
      goto fail;
    if ((uint64_t) nbd_get_size (h) != size) {
      backup_error ("%s: %" PRId64 " bytes, the backup %" PRIu64, tmp,
                    nbd_get_size (h), size);
      goto fail;
    }
    got = malloc (nb * SHA256_LEN + 1);
    if (got == NULL)
      goto fail;
    sha256_zero (block, z);
    sha256_zero (size - (nb - 1) * block, zl);
    for (uint64_t b = 0; b < nb; ++b)
      memcpy (got + b * SHA256_LEN, b == nb - 1 ? zl : z, SHA256_LEN);
    if (data_ranges (h, size, block, &ranges, &nranges) == -1)
      goto fail;
    memset (&job, 0, sizeof job);
    job.src = &h;
    job.nsrc = 1;
    job.ranges = ranges;
    job.nranges = nranges;
    job.size = size;
    job.block = block;
    job.sums = got;
    job.what = "verify";
    if (copy_run (&job, err, sizeof err) == -1) {
      backup_error ("verifying %s: %s", out, err);
      goto fail;
    }
    for (uint64_t b = 0; b < nb; ++b)
      if (memcmp (got + b * SHA256_LEN, expected + b * SHA256_LEN,
                  SHA256_LEN) != 0) {
        backup_error ("the restored disk differs from run %" PRIu64
                      " at offset %" PRIu64 " (block of %" PRIu64 " bytes): "
                      "the backup chain is damaged", json_u64 (run, "seq"),
                      b * block, block);
        goto fail;
      }
    disconnect (h);
    h = NULL;
  }
  {
    int fd = open (tmp, O_RDONLY | O_CLOEXEC);
    if (fd == -1 || fsync (fd) == -1) {
      backup_error ("%s: fsync: %m", tmp);
      if (fd >= 0)
        close (fd);
      goto fail;
    }
    close (fd);
  }
  if (rename (tmp, out) == -1) {
    backup_error ("rename %s to %s: %m", tmp, out);
    goto fail;
  }
  backup_info ("restored run %" PRIu64 " (%s) to %s%s",
               json_u64 (run, "seq"), json_str (run, "time"), out,
               expected ? ", verified" : "");
  status = EXIT_OK;
  goto done;

 fail:
  disconnect (h);
  h = NULL;
  unlink (tmp);
 done:
  disconnect (h);
  free (ranges);
  free (expected);
  free (got);
  json_decref (manifest);
  close (d.fd);
  return status;
}

int
main (int argc, char *argv[])
{
  enum { OPT_FULL = 256, OPT_AT, OPT_COW_DIR };
  static const struct option long_options[] = {
    { "socket", required_argument, NULL, 'S' },
    { "uri", required_argument, NULL, 'u' },
    { "full", no_argument, NULL, OPT_FULL },
    { "at", required_argument, NULL, OPT_AT },
    { "output-format", required_argument, NULL, 'O' },
    { "cow-dir", required_argument, NULL, OPT_COW_DIR },
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, 'V' },
    { NULL, 0, NULL, 0 },
  };
  struct options o = { .at = -1, .format = NULL };
  struct sigaction sa = { .sa_handler = on_signal };
  char cow_dir[PATH_MAX];
  const char *cmd;
  int c;

  while ((c = getopt_long (argc, argv, "S:u:O:hV", long_options, NULL))
         != -1) {
    switch (c) {
    case 'S': o.socket = optarg; break;
    case 'u': o.uri = optarg; break;
    case 'O': o.format = optarg; break;
    case OPT_FULL: o.full = true; break;
    case OPT_COW_DIR: o.cow_dir = optarg; break;
    case OPT_AT: {
      char *end;
      errno = 0;
      o.at = strtol (optarg, &end, 10);
      if (errno || end == optarg || *end || o.at < 1) {
        fprintf (stderr, "snapfg-backup: --at: not a run number: %s\n",
                 optarg);
        return EXIT_USAGE;
      }
      break;
    }
    case 'h': usage (stdout); return EXIT_OK;
    case 'V': printf ("snapfg-backup %s\n", PACKAGE_VERSION); return EXIT_OK;
    default: usage (stderr); return EXIT_USAGE;
    }
  }
  if (optind >= argc) {
    usage (stderr);
    return EXIT_USAGE;
  }
  cmd = argv[optind++];

  sigemptyset (&sa.sa_mask);
  sigaction (SIGINT, &sa, NULL);
  sigaction (SIGTERM, &sa, NULL);
  signal (SIGPIPE, SIG_IGN);

  if (strcmp (cmd, "backup") == 0) {
    if (argc - optind != 1 || o.at >= 0 || o.format) {
      fprintf (stderr, "snapfg-backup: usage: snapfg-backup -S CONTROL "
               "-u NBD_URI backup DIR [--full]\n");
      return EXIT_USAGE;
    }
    if (o.socket == NULL || o.uri == NULL) {
      fprintf (stderr, "snapfg-backup: backup: give the server's control "
               "socket with -S CONTROL and its NBD URI with -u NBD_URI\n");
      return EXIT_USAGE;
    }
    if (o.cow_dir) {
      /* The server runs in "/": it needs an absolute path. */
      if (realpath (o.cow_dir, cow_dir) == NULL) {
        fprintf (stderr, "snapfg-backup: --cow-dir %s: %m\n", o.cow_dir);
        return EXIT_USAGE;
      }
      o.cow_dir = cow_dir;
    }
    return cmd_backup (&o, argv[optind]);
  }
  if (strcmp (cmd, "restore") == 0) {
    if (argc - optind != 2 || o.full || o.cow_dir) {
      fprintf (stderr, "snapfg-backup: usage: snapfg-backup restore DIR OUT "
               "[--at N] [-O raw|qcow2]\n");
      return EXIT_USAGE;
    }
    if (o.format == NULL)
      o.format = "raw";
    if (strcmp (o.format, "raw") != 0 && strcmp (o.format, "qcow2") != 0) {
      fprintf (stderr, "snapfg-backup: -O %s: the output format is raw or "
               "qcow2\n", o.format);
      return EXIT_USAGE;
    }
    return cmd_restore (&o, argv[optind], argv[optind + 1]);
  }
  fprintf (stderr, "snapfg-backup: unknown command '%s' (backup or restore; "
           "see snapfg-backup --help)\n", cmd);
  return EXIT_USAGE;
}
