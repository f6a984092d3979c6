/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the backup command, one run.
 *
 * A snapshot and a checkpoint at one instant, the copy of the snapshot
 * (all its data, or what changed since the previous run's checkpoint)
 * into a new qcow2 image, the run recorded in the manifest, the older
 * checkpoint dropped; the crash-safe order is at the top of
 * snapfg-backup-main.c.  On failure the server is left as the run found it.
 */

#include <config.h>

#include <stdio.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "rounding.h"
#include "snapfg-backup.h"

#define MAX_SOURCES 4           /* connections to the snapshot (multi-conn) */
#define NAME_PREFIX "snapfg-backup-"

static void
iso_time (time_t t, char out[32])
{
  struct tm tm;

  gmtime_r (&t, &tm);
  strftime (out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
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

/* Send REQ (consumed) to the server; a refusal or no answer is said
 * as "WHAT NAME: why".
 */
static int
server_request (const struct backup_options *o, json_t *req,
                const char *what, const char *name)
{
  json_t *reply;
  char err[512];

  reply = control_call (o, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("%s %s: %s", what, name, err);
    return -1;
  }
  json_decref (reply);
  return 0;
}


static int
drop_checkpoint (const struct backup_options *o, const char *name)
{
  json_t *req = control_request (CONTROL_CHECKPOINT_DROP);

  control_request_set_string (req, "name", name);
  return server_request (o, req, "warning: dropping checkpoint", name);
}

struct run;
static int drop_snapshot (struct run *r, const char *name);

/* The state of one run, from step to step. */
enum run_kind { RUN_FULL, RUN_INCREMENTAL, RUN_DIFFERENTIAL };

struct run {
  const struct backup_options *o;
  const char *dir_path;
  char *dir_owned;              /* dir_path when the run made it (a group) */
  struct backup_dir d;
  bool dir_created;             /* by this run: removed if it fails */
  json_t *manifest, *runs, *last;
  json_t *base;                 /* the run this one copies changes since */
  enum run_kind kind;
  const char *since;            /* checkpoint the changes are since */
  const char *backing;          /* the image under this run's */
  int base_depth;               /* images in the base run's chain */
  struct image_access access;
  uint64_t size, block;
  unsigned seq;
  char prefix[64], name[96], image[64], partial[80], sums_name[32];
  char cow_dir[PATH_MAX];
  struct nbd_handle *src[MAX_SOURCES], *dst;
  size_t nsrc;
  struct copy_range *ranges;
  size_t nranges;
  unsigned char *sums;
  struct copy_job job;
  time_t started, finished;
  double t0;                    /* tool_now () at the snapshot */
  bool snapshot_made, checkpoint_made, image_made, recorded, empty;
  bool forced_full;             /* a full because a verify failed */
  const char *group;            /* the runs taken at the same instant */
  json_t *group_info;           /* and what the manifest says of them */
  /* The image, made by a thread while the copy is prepared. */
  pthread_t image_thread;
  bool image_started;           /* the thread runs, or ran */
  bool plain_full;              /* written directly (image_fd) */
  int image_status;             /* image_create's: 0, -1 or -2 */
  int image_fd;                 /* a plain full's, or -1 */
};

static const char *
kind_article (enum run_kind k)
{
  return k == RUN_INCREMENTAL ? "an" : "a";
}

static const char *
kind_name (enum run_kind k)
{
  return k == RUN_FULL ? "full" : k == RUN_INCREMENTAL ? "incremental"
                                                       : "differential";
}

/* The latest full run of the manifest (NULL: none). */
static json_t *
latest_full (json_t *runs)
{
  json_t *v, *full = NULL;
  size_t i;

  json_array_foreach (runs, i, v)
    if (json_str (v, "type") && strcmp (json_str (v, "type"), "full") == 0)
      full = v;
  return full;
}

/* The checkpoint a differential after FULL starts from: the full's own,
 * or, for a full that prune made of an incremental, the one of the full
 * it was committed into (which covers more, so the delta is still
 * complete).
 */
static const char *
diff_checkpoint (json_t *full)
{
  const char *c = json_str (full, "diff_checkpoint");

  return c ? c : json_str (full, "checkpoint");
}

/* 1. The directory: private, locked, its manifest (or a new one). */
static int
run_open_dir (struct run *r)
{
  char err[1024];
  bool missing;

  if (open_backup_dir_created (r->dir_path, true, &r->d, &r->dir_created)
      == -1)
    return -1;
  if (check_private_dir (&r->d) == -1 || lock_backup_dir (&r->d) == -1)
    return -1;
  r->manifest = manifest_read (r->d.fd, r->dir_path, &missing,
                               err, sizeof err);
  if (r->manifest == NULL && !missing) {
    backup_error ("%s", err);
    return -1;
  }
  if (r->manifest == NULL) {
    unsigned char id[4];
    char idhex[9];
    if (check_new_dir (&r->d) == -1)
      return -1;
    if (getrandom (id, sizeof id, 0) != sizeof id) {
      backup_error ("getrandom: %m");
      return -1;
    }
    snprintf (idhex, sizeof idhex, "%02x%02x%02x%02x", id[0], id[1], id[2],
              id[3]);
    r->manifest = json_pack ("{s:s, s:i, s:s, s:[]}",
                             "format", "snapfg-backup-manifest", "version", 1,
                             "chain_id", idhex, "runs");
  }
  r->runs = json_object_get (r->manifest, "runs");
  if (json_array_size (r->runs) > 0)
    r->last = json_array_get (r->runs, json_array_size (r->runs) - 1);
  if (r->last && json_is_true (json_object_get (json_array_get (r->runs, 0),
                                                "pruning"))) {
    backup_error ("%s: a prune was interrupted: run prune again first",
                  r->dir_path);
    return -1;
  }
  if (clean_leftovers (&r->d, r->last) == -1)
    return -1;
  r->seq = r->last ? json_u64 (r->last, "seq") + 1 : 1;
  snprintf (r->prefix, sizeof r->prefix, NAME_PREFIX "%s-",
            json_str (r->manifest, "chain_id"));
  return 0;
}

/* A run of the chain since its latest full whose verify failed (its
 * images, or those under it, are damaged): NULL if none.  A later
 * successful verify of that run clears the mark.
 */
static json_t *
damaged_run (json_t *runs, json_t *full)
{
  json_t *v, *damaged = NULL;
  bool after = false;
  size_t i;

  json_array_foreach (runs, i, v) {
    after = after || v == full;
    if (after && json_str (v, "verify_failed"))
      damaged = v;
  }
  return damaged;
}

/* 2. The kind of run, and how its image is written. */
static int
run_choose_kind (struct run *r)
{
  const struct backup_options *o = r->o;
  json_t *full = latest_full (r->runs), *damaged = damaged_run (r->runs, full);
  bool chain_encrypted = full &&
    json_is_true (json_object_get (full, "encrypted"));
  bool encrypt;

  r->kind = !r->last || o->full ? RUN_FULL
          : o->diff ? RUN_DIFFERENTIAL : RUN_INCREMENTAL;
  if (r->kind == RUN_DIFFERENTIAL && full == NULL) {
    backup_error ("--diff: the chain has no full run: run with --full");
    return EXIT_NEED_FULL;
  }
  /* Encryption is the chain's: fixed by its full run. */
  if (r->kind != RUN_FULL && o->encrypt && !chain_encrypted) {
    backup_error ("--encrypt: the chain in %s is not encrypted; start an "
                  "encrypted one with --full --encrypt --key-file FILE",
                  r->dir_path);
    return EXIT_USAGE;
  }
  /* A run over damaged images would reference the damage: a verify
   * found it, so this run stores the whole disk again (a full, of the
   * chain's encryption).
   */
  if (r->kind != RUN_FULL && damaged) {
    backup_info ("run %" PRIu64 " failed verify (%s): this run is a full "
                 "backup, so that it references none of the damaged images",
                 json_u64 (damaged, "seq"), json_str (damaged,
                                                      "verify_failed"));
    r->kind = RUN_FULL;
    r->forced_full = true;
  }
  encrypt = r->kind == RUN_FULL ? o->encrypt || (r->forced_full &&
                                                 chain_encrypted)
                                : chain_encrypted;
  if (encrypt) {
    if (o->key_file == NULL) {
      backup_error ("%s: give the key with --key-file FILE",
                    r->kind == RUN_FULL && !r->forced_full ? "--encrypt"
                    : "the chain is encrypted");
      return EXIT_USAGE;
    }
    r->access.key_file = o->key_file;
  }
  r->access.compress = o->compress;
  if (r->kind == RUN_INCREMENTAL)
    r->base = r->last;
  else if (r->kind == RUN_DIFFERENTIAL)
    r->base = full;
  return 0;
}

/* With --cow-dir: this chain's stores that no snapshot uses any more
 * (every snapshot of the chain is dropped by now), such as the store of
 * a run's snapshot that the server dropped when it restarted after a
 * crash (a temporary snapshot's store is the tool's to remove).
 */
static void
remove_cow_leftovers (struct run *r)
{
  DIR *dir;
  struct dirent *ent;
  size_t len;

  if (r->o->cow_dir == NULL || (dir = opendir (r->cow_dir)) == NULL)
    return;
  while ((ent = readdir (dir)) != NULL) {
    len = strlen (ent->d_name);
    if (strncmp (ent->d_name, r->prefix, strlen (r->prefix)) == 0 &&
        len > 4 && strcmp (ent->d_name + len - 4, ".cow") == 0 &&
        unlinkat (dirfd (dir), ent->d_name, 0) == 0)
      backup_info ("removed %s/%s, the store of an interrupted run's "
                   "snapshot", r->cow_dir, ent->d_name);
  }
  closedir (dir);
}

/* 3. The server: reachable, the origin's size, snapshots left by
 * interrupted runs of this chain dropped.
 */
static int
run_inspect_server (struct run *r)
{
  json_t *req, *reply, *v;
  char err[512];
  size_t i;

  req = control_request (CONTROL_STATUS);
  reply = control_call (r->o, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("%s", err);
    return control_failure_status (r->o);
  }
  r->size = json_u64 (json_object_get (reply, "origin"), "size");
  json_array_foreach (json_object_get (reply, "snapshots"), i, v) {
    const char *n = json_str (v, "name");
    if (n && strncmp (n, r->prefix, strlen (r->prefix)) == 0) {
      backup_info ("dropping snapshot %s, left by an interrupted run", n);
      drop_snapshot (r, n);
    }
  }
  json_decref (reply);
  remove_cow_leftovers (r);
  if (r->size == 0) {
    backup_error ("the server reports an empty origin: nothing to back up");
    return -1;
  }
  return 0;
}

/* 4. The sums to start from: the base run's, or all zero for a full. */
static int
run_start_sums (struct run *r)
{
  char err[1024];

  if (r->kind == RUN_FULL) {
    r->block = sum_block_for (r->size);
    /* Blocks the copy skips (holes) read as zero. */
    r->sums = sums_new_zero (r->block, r->size);
    if (r->sums == NULL) {
      backup_error ("out of memory");
      return EXIT_FAILED;
    }
    return 0;
  }
  r->since = r->kind == RUN_DIFFERENTIAL ? diff_checkpoint (r->base)
                                         : json_str (r->base, "checkpoint");
  r->backing = run_image (r->base);
  r->block = json_u64 (r->base, "sum_block");
  if (json_u64 (r->base, "size") != r->size) {
    backup_error ("the origin's size changed since run %" PRIu64 " (%" PRIu64
                  " bytes, now %" PRIu64 "): an %s backup is impossible; "
                  "run with --full", json_u64 (r->base, "seq"),
                  json_u64 (r->base, "size"), r->size, kind_name (r->kind));
    return EXIT_NEED_FULL;
  }
  r->sums = run_sums (r->d.fd, r->dir_path, r->base, err, sizeof err);
  if (r->sums == NULL) {
    backup_error ("%s; %s %s backup needs it: run with --full", err,
                  kind_article (r->kind), kind_name (r->kind));
    return EXIT_NEED_FULL;
  }
  /* The new image goes over the base run's chain: it must be the one
   * the manifest records (qemu-nbd reads it to fill what is not copied).
   * A wrong key must fail now, before a snapshot and an image exist.
   */
  {
    char **chain = NULL;
    int s = EXIT_OK;
    r->base_depth = chain_check (r->d.fd, r->dir_path, r->manifest, r->base,
                                 &chain);
    if (r->base_depth < 0)
      s = EXIT_FAILED;
    else if (r->access.key_file &&
             image_key_check (r->dir_path, chain[0], &r->access) == -1)
      s = EXIT_USAGE;
    chain_free (chain);
    if (s != EXIT_OK)
      return s;
  }
  return 0;
}

/* 5. Snapshot and checkpoint at one instant (the NBD server must be
 * reachable first, so that a run that cannot copy changes nothing).
 */
static int
run_connect (struct run *r)
{
  unsigned char rnd[2];

  r->src[0] = connect_server (r->o->session->data_uri,
                             r->o->session->data_what, r->kind == RUN_FULL);
  if (r->src[0] == NULL)
    return EXIT_UNREACHABLE;
  r->nsrc = 1;
  if (getrandom (rnd, sizeof rnd, 0) != sizeof rnd) {
    backup_error ("getrandom: %m");
    return -1;
  }
  snprintf (r->name, sizeof r->name, "%s%04u-%02x%02x", r->prefix, r->seq,
            rnd[0], rnd[1]);
  snprintf (r->image, sizeof r->image, "%04u-%s.qcow2", r->seq,
            r->kind == RUN_FULL ? "full"
            : r->kind == RUN_INCREMENTAL ? "incr" : "diff");
  snprintf (r->partial, sizeof r->partial, "%s.partial", r->image);
  snprintf (r->sums_name, sizeof r->sums_name, "%04u.sums", r->seq);
  return 0;
}

/* 5b. The create itself (with several disks, while every server holds
 * its writes).
 */
static int
run_take_snapshot (struct run *r)
{
  json_t *req, *reply;
  char err[512];

  req = control_request (CONTROL_CREATE);
  control_request_set_string (req, "name", r->name);
  control_request_set_string (req, "checkpoint", r->name);
  control_request_set_string (req, "checkpoint_owner", r->o->session->owner);
  /* The snapshot serves this run only: should the server die during
   * it, it is dropped at the server's next start rather than kept
   * copying out every first write until this chain's next run.
   */
  control_request_set (req, "temporary", json_true ());
  if (r->o->cow_dir) {
    char cow_path[PATH_MAX + 128];
    snprintf (cow_path, sizeof cow_path, "%s/%s.cow", r->cow_dir, r->name);
    control_request_set_string (req, "cow", cow_path);
  }
  r->started = time (NULL);
  r->t0 = tool_now ();
  reply = control_call (r->o, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("creating snapshot and checkpoint %s: %s (snapfg-backup "
                  "needs a server started with state=FILE and control=SOCKET)",
                  r->name, err);
    return -1;
  }
  json_decref (reply);
  r->snapshot_made = r->checkpoint_made = true;
  return 0;
}

/* 6. What to copy: the changed ranges, or every data extent. */
static int
run_find_ranges (struct run *r)
{
  json_t *req, *reply, *a, *v;
  char err[512];
  size_t i;

  if (open_export (r->src[0], r->o->session->data_what, r->name) == -1)
    return EXIT_FAILED;
  if ((uint64_t) nbd_get_size (r->src[0]) != r->size) {
    backup_error ("export %s: %" PRId64 " bytes, the origin %" PRIu64,
                  r->name, nbd_get_size (r->src[0]), r->size);
    return EXIT_FAILED;
  }
  if (r->kind == RUN_FULL)
    return data_ranges (r->src[0], r->size, r->block, &r->ranges,
                        &r->nranges) == -1 ? EXIT_FAILED : 0;
  req = control_request (CONTROL_CHANGED);
  control_request_set_string (req, "since", r->since);
  control_request_set_string (req, "name", r->name);
  reply = control_call (r->o, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL && control_failure_status (r->o) != EXIT_FAILED) {
    /* No reply: the server went away, it did not refuse. */
    backup_error ("asking the server what changed since checkpoint %s: %s",
                  r->since, err);
    return control_failure_status (r->o);
  }
  if (reply == NULL) {
    backup_error ("%s %s backup since checkpoint %s is impossible: %s; run "
                  "with --full", kind_article (r->kind), kind_name (r->kind),
                  r->since, err);
    return EXIT_NEED_FULL;
  }
  a = json_object_get (reply, "ranges");
  r->ranges = malloc ((json_array_size (a) + 1) * sizeof *r->ranges);
  if (r->ranges == NULL) {
    json_decref (reply);
    backup_error ("out of memory");
    return EXIT_FAILED;
  }
  json_array_foreach (a, i, v)
    r->ranges[r->nranges++] = (struct copy_range) { json_u64 (v, "offset"),
                                                    json_u64 (v, "length") };
  json_decref (reply);
  r->nranges = normalise_ranges (r->ranges, r->nranges, r->block, r->size);
  /* Nothing changed: the run is recorded without an image of its own. */
  r->empty = r->nranges == 0;
  return 0;
}

/* 6b. The new image (created exclusively), by a thread: qemu-img
 * create takes 20 ms on an idle machine and up to 0.27 s under load,
 * the block status and the other connections 15-40 ms, and the one is
 * done while the other waits on the server.  A full run always needs
 * its image and starts it right after the snapshot; an incremental
 * only once it knows that something changed (run_copy).
 */
static void *
image_thread (void *arg)
{
  struct run *r = arg;

  r->image_status = image_create (r->d.fd, r->dir_path, r->partial, r->size,
                                  r->backing, &r->access,
                                  r->plain_full ? &r->image_fd : NULL);
  return NULL;
}

static void
run_start_image (struct run *r)
{
  test_pause ("before-image");
  /* A new plain full image is written by this tool directly (see
   * snapfg-backup-direct.c); the others go through qemu-nbd, which
   * knows compressed clusters, encryption and backing files.
   */
  r->plain_full = r->kind == RUN_FULL && r->backing == NULL &&
    r->access.key_file == NULL && r->access.compress == NULL;
  r->image_fd = -1;
  if (pthread_create (&r->image_thread, NULL, image_thread, r) == 0)
    r->image_started = true;
  else
    image_thread (r);           /* no thread: made here, at once */
}

/* Wait for the image: 0, or -1 when it could not be made.  A SIGINT or
 * SIGTERM is delivered to one thread, most often this one, and would
 * not interrupt the image thread's wait for qemu-img (which may never
 * end: a key file that is a FIFO nobody writes); it is passed on until
 * the thread stops qemu-img (run_command) and ends.
 */
static int
run_wait_image (struct run *r)
{
  while (r->image_started) {
    struct timespec ts;

    clock_gettime (CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000 * 1000;
    if (ts.tv_nsec >= 1000 * 1000 * 1000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000 * 1000 * 1000;
    }
    if (pthread_timedjoin_np (r->image_thread, NULL, &ts) == 0)
      r->image_started = false;
    else if (backup_interrupted)
      pthread_kill (r->image_thread, SIGTERM);
  }
  if (r->image_status != -2)
    r->image_made = true;
  return r->image_status == 0 ? 0 : -1;
}

/* The copy is done: the snapshot and its connections are let go (a
 * failure afterwards has nothing more to read).
 */
static void
run_release_snapshot (struct run *r)
{
  disconnect_all (r->src, r->nsrc);
  r->nsrc = 0;
  if (r->snapshot_made)
    drop_snapshot (r, r->name);
  r->snapshot_made = false;
}

/* 7. The copy into the new image. */
static int
run_copy (struct run *r)
{
  char err[1024], *stop_env;
  struct direct_map direct = { .fd = -1 };
  int c, fd = -1;

  /* More connections when the server says they see the same data. */
  if (nbd_can_multi_conn (r->src[0]) == 1)
    r->nsrc += connect_exports (r->o->session->data_uri,
                                r->o->session->data_what, r->name,
                                r->src + r->nsrc, MAX_SOURCES - r->nsrc);
  if (!r->image_made && !r->image_started)
    run_start_image (r);
  if (run_wait_image (r) == -1)
    return -1;
  fd = r->image_fd;
  r->image_fd = -1;
  if (fd >= 0 && direct_map_read (fd, r->size, &direct) == -1) {
    backup_info ("%s/%s: not laid out as expected for direct writes; "
                 "writing it through qemu-nbd", r->dir_path, r->partial);
    close (fd);
    fd = -1;
  }
  if (fd == -1) {
    r->dst = image_open (r->dir_path, r->partial,
                         1 + r->base_depth,
                         &r->access, false);
    if (r->dst == NULL)
      return -1;
  }
  if (r->dst && (uint64_t) nbd_get_size (r->dst) != r->size) {
    backup_error ("%s/%s: qemu-nbd serves %" PRId64 " bytes, expected %"
                  PRIu64, r->dir_path, r->partial, nbd_get_size (r->dst),
                  r->size);
    return -1;
  }
  memset (&r->job, 0, sizeof r->job);
  r->job.src = r->src;
  r->job.nsrc = r->nsrc;
  r->job.dst = r->dst;
  r->job.direct = fd >= 0 ? &direct : NULL;
  r->job.ranges = r->ranges;
  r->job.nranges = r->nranges;
  r->job.size = r->size;
  r->job.block = r->block;
  r->job.sums = r->sums;
  r->job.write_zeroes = r->kind != RUN_FULL;
  r->job.what = r->kind == RUN_FULL ? "full backup"
              : r->kind == RUN_INCREMENTAL ? "incremental backup"
              : "differential backup";
  r->job.rate = r->o->limit_rate;
  stop_env = getenv ("SNAPFG_BACKUP_TEST_STOP_AFTER");
  if (stop_env)
    r->job.stop_after = strtoull (stop_env, NULL, 10);
  c = copy_run (&r->job, err, sizeof err);
  r->job.direct = NULL;
  /* Tests: the copy is done, the snapshot still there. */
  if (c == 0)
    test_pause ("after-copy");
  if (fd >= 0) {
    /* Durable before the manifest names it, as qemu-nbd's flush and
     * the fsync below make the other images.  The writeback of the
     * last pieces is started first, and goes on while the snapshot is
     * dropped (a round trip to the server): the fsync waits for less.
     */
    direct_map_free (&direct);
    if (c == 0) {
      (void) sync_file_range (fd, 0, 0, SYNC_FILE_RANGE_WRITE);
      run_release_snapshot (r);
      if (fsync (fd) == -1) {
        backup_error ("%s/%s: fsync: %m", r->dir_path, r->partial);
        c = -1;
        err[0] = '\0';
      }
    }
    close (fd);
    if (c == -1) {
      if (err[0])
        backup_error ("backup of snapshot %s failed: %s", r->name, err);
      return -1;
    }
    return 0;
  }
  if (c == -1) {
    backup_error ("backup of snapshot %s failed: %s", r->name, err);
    return -1;
  }
  run_release_snapshot (r);
  if (nbd_flush (r->dst, 0) == -1) {
    backup_error ("%s/%s: flush: %s", r->dir_path, r->partial,
                  nbd_get_error ());
    return -1;
  }
  disconnect (r->dst);          /* waits for qemu-nbd to exit */
  r->dst = NULL;
  if (fsync_file (r->d.fd, r->partial) == -1) {
    backup_error ("%s/%s: fsync: %m", r->dir_path, r->partial);
    return -1;
  }
  return 0;
}

/* 8. The snapshot has served its purpose; the sums, then the manifest,
 * then the image's rename (the crash-safe order at the top of
 * snapfg-backup-main.c).
 */
static int
run_record (struct run *r)
{
  unsigned char copied_sum[SHA256_LEN], disk_sum[SHA256_LEN];
  char err[1024], hex1[65], hex2[65], when[32];
  const char *sums_name = r->sums_name, *image = r->image;
  uint64_t rb = 0;
  json_t *run;
  size_t i;

  run_release_snapshot (r);     /* done already unless nothing changed */
  r->finished = time (NULL);

  if (r->empty) {
    /* The disk is the base run's: its image and its sums say it all. */
    sums_name = json_str (r->base, "sums");
    image = run_image (r->base);
  }
  else if (sums_write (r->d.fd, r->sums_name, r->block, r->size, r->sums,
                       err, sizeof err) == -1) {
    backup_error ("%s/%s", r->dir_path, err);
    return -1;
  }
  sums_digest (r->sums, r->block, r->ranges, r->nranges, r->size, copied_sum);
  sums_digest (r->sums, r->block, NULL, 0, r->size, disk_sum);
  hex_digest (copied_sum, hex1);
  hex_digest (disk_sum, hex2);
  iso_time (r->started, when);
  for (i = 0; i < r->nranges; ++i)
    rb += r->ranges[i].length;
  run = json_pack ("{s:i, s:s, s:s, s:s?, s:s, s:s, s:s?, s:s, s:I, s:I,"
                   " s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:s, s:s, s:s}",
                   "seq", (int) r->seq,
                   "type", kind_name (r->kind),
                   "image", image,
                   "backing", r->empty ? json_str (r->base, "backing")
                                       : r->backing,
                   "snapshot", r->name,
                   "checkpoint", r->name,
                   "since", r->since,
                   "time", when,
                   "started", (json_int_t) r->started,
                   "finished", (json_int_t) r->finished,
                   "size", (json_int_t) r->size,
                   "sum_block", (json_int_t) r->block,
                   "bytes_read", (json_int_t) r->job.bytes_read,
                   "bytes_copied", (json_int_t) r->job.bytes_written,
                   "bytes_zeroed", (json_int_t) r->job.bytes_zeroed,
                   "ranges_bytes", (json_int_t) rb,
                   "ranges", (int) r->nranges,
                   "sums", sums_name,
                   "copied_sha256", hex1,
                   "disk_sha256", hex2);
  if (run == NULL) {
    backup_error ("out of memory");
    return -1;
  }
  if (r->empty)
    json_object_set_new (run, "empty", json_true ());
  if (r->kind == RUN_DIFFERENTIAL)
    json_object_set_new (run, "base", json_integer (json_u64 (r->base,
                                                              "seq")));
  if (r->access.key_file)
    json_object_set_new (run, "encrypted", json_true ());
  if (r->forced_full)
    json_object_set_new (run, "full_because", json_string ("verify_failed"));
  if (r->group) {
    json_object_set_new (run, "group", json_string (r->group));
    if (r->group_info)
      json_object_update (run, r->group_info);
  }
  if (r->access.compress && !r->empty)
    json_object_set_new (run, "compression", json_string (r->access.compress));
  json_array_append_new (r->runs, run);
  if (manifest_write (r->d.fd, r->dir_path, r->manifest, err, sizeof err)
      == -1) {
    backup_error ("%s", err);
    json_array_remove (r->runs, json_array_size (r->runs) - 1);
    return -1;
  }
  r->recorded = true;
  if (!r->empty &&
      (renameat (r->d.fd, r->partial, r->d.fd, r->image) == -1 ||
       fsync_dir (r->d.fd) == -1)) {
    backup_error ("%s/%s: rename to %s: %m (the next run finishes it)",
                  r->dir_path, r->partial, r->image);
    return -1;
  }
  return 0;
}

/* The checkpoint to keep for differentials: the latest full's (a
 * --diff starts there), kept beside the last run's for as long as that
 * full is the chain's latest, so that --diff works after any run, not
 * only right after the full (the cost: a second bitmap on the server).
 * NULL when the chain has no full.
 */
const char *
diff_checkpoint_to_keep (json_t *runs)
{
  json_t *full = latest_full (runs);

  return full ? diff_checkpoint (full) : NULL;
}

/* 9. Checkpoints no run needs any more: all of this chain's but this
 * run's and the latest full's (a next --diff starts there), including
 * leftovers of interrupted runs (kept until now, so that "changed
 * since" stays exact whatever happens); and those of chains whose
 * directory was deleted (or holds another chain now), so that they do
 * not pile up on the server until someone runs prune -S.
 */
static void
run_drop_old_checkpoints (struct run *r)
{
  json_decref (drop_unneeded_checkpoints (r->o, r->manifest, false));
}

/* A run that is not recorded leaves the server and the directory as it
 * found them.
 */
static void
run_cleanup (struct run *r, bool ok)
{
  size_t i;

  if (r->dst)
    disconnect (r->dst);
  /* A failure while the image was being made: it is made, then removed. */
  if (r->image_started)
    run_wait_image (r);
  if (r->image_fd >= 0)
    close (r->image_fd);
  if (!ok && !r->recorded && r->image_made)
    unlinkat (r->d.fd, r->partial, 0);
  for (i = 0; i < r->nsrc; ++i)
    disconnect (r->src[i]);
  if (r->snapshot_made)
    drop_snapshot (r, r->name);
  /* Without its new checkpoint, the older one tracks again (the server
   * folds the dropped checkpoint's bits into it).  If this fails too,
   * the next run drops it as a leftover.
   */
  if (r->checkpoint_made && !r->recorded)
    drop_checkpoint (r->o, r->name);
  /* A directory this run made and could not fill is not left behind. */
  if (!ok && r->dir_created && !r->recorded && r->d.fd >= 0) {
    unlinkat (r->d.fd, ".lock", 0);
    rmdir (r->dir_path);
  }
  free (r->ranges);
  free (r->sums);
  json_decref (r->manifest);
  if (r->d.fd >= 0)
    close (r->d.fd);
  if (r->d.lock_fd >= 0)
    close (r->d.lock_fd);
}

/* Did the copy fail because the server went away (a connection to it
 * is dead), rather than because of what it or the image said?
 */
static bool
run_lost_server (struct run *r)
{
  for (size_t i = 0; i < r->nsrc; ++i)
    if (r->src[i] && (nbd_aio_is_dead (r->src[i]) ||
                      nbd_aio_is_closed (r->src[i])))
      return true;
  return false;
}

/* --cow-dir: the server runs in "/", so an absolute path; created
 * (0700) if missing.
 */
static int
run_cow_dir (struct run *r)
{
  if (r->o->cow_dir == NULL)
    return 0;
  if (mkdir (r->o->cow_dir, 0700) == -1 && errno != EEXIST) {
    backup_error ("--cow-dir %s: cannot create it: %m", r->o->cow_dir);
    return -1;
  }
  if (realpath (r->o->cow_dir, r->cow_dir) == NULL) {
    backup_error ("--cow-dir %s: %m", r->o->cow_dir);
    return -1;
  }
  return 0;
}

/* The phases of a run, for cmd_backup and for a backup of several
 * disks at one instant (snapfg-backup-group.c): prepare every disk's,
 * take every snapshot while the servers hold their writes, then
 * complete each.
 */
struct run *
run_new (const struct backup_options *o, const char *dir_path)
{
  struct run *r = calloc (1, sizeof *r);

  if (r == NULL) {
    backup_error ("out of memory");
    return NULL;
  }
  r->o = o;
  r->dir_path = dir_path;
  r->d.fd = r->d.lock_fd = -1;
  r->image_fd = -1;
  return r;
}

/* Steps 1 to 4, and the connection to the server.  An exit status. */
int
run_prepare (struct run *r)
{
  int s;

  if (run_cow_dir (r) == -1 || run_open_dir (r) == -1)
    return EXIT_FAILED;
  if ((s = run_choose_kind (r)) != 0)
    return s;
  if ((s = run_inspect_server (r)) != 0)
    return s < 0 ? EXIT_FAILED : s;
  if ((s = run_start_sums (r)) != 0)
    return s;
  if ((s = run_connect (r)) != 0)
    return s < 0 ? EXIT_FAILED : s;
  return EXIT_OK;
}

int
run_snapshot (struct run *r)
{
  int s = run_take_snapshot (r);

  return s < 0 ? EXIT_FAILED : s;
}

/* Steps 6 to 9: the copy and the record (as part of GROUP, if not
 * NULL, with INFO's members in the run's record too).
 */
int
run_complete (struct run *r, const char *group, json_t *info)
{
  int s;

  r->group = group;
  r->group_info = info;
  if (r->kind == RUN_FULL)
    run_start_image (r);
  if ((s = run_find_ranges (r)) != 0)
    return s;
  if (!r->empty && run_copy (r) == -1)
    return run_lost_server (r) ? EXIT_UNREACHABLE : EXIT_FAILED;
  if (run_record (r) == -1)
    return EXIT_FAILED;
  run_drop_old_checkpoints (r);
  backup_report_run (json_array_get (r->runs, json_array_size (r->runs) - 1),
                     r->dir_path, tool_now () - r->t0);
  return EXIT_OK;
}

/* Clean up (a failed run leaves the server and directory as it found
 * them) and free.
 */
void
run_end (struct run *r, bool ok)
{
  if (r == NULL)
    return;
  run_cleanup (r, ok);
  free (r->dir_owned);
  free (r);
}

/* --- a qcow2 chain's run in a group (snapfg-backup-group.c) --- */

/* Disk NAME's chain: REPO/NAME when it is one of several disks, else
 * REPO itself (main made it REPO/NAME already for one --disk).
 */
static void *
chain_new (void *opaque, struct backup_options *o, const char *repo,
           const char *name, bool several)
{
  struct run *r;
  char *dir;

  if (several && mkdir (repo, 0700) == -1 && errno != EEXIST) {
    backup_error ("%s: %m", repo);
    return NULL;
  }
  if ((several ? asprintf (&dir, "%s/%s", repo, name)
               : asprintf (&dir, "%s", repo)) == -1) {
    backup_error ("out of memory");
    return NULL;
  }
  r = run_new (o, dir);
  if (r == NULL) {
    free (dir);
    return NULL;
  }
  r->dir_owned = dir;
  return r;
}

static const char *
chain_where (void *run)
{
  return ((struct run *) run)->dir_path;
}

static int
chain_prepare (void *run)
{
  return run_prepare (run);
}

static int
chain_snapshot (void *run)
{
  return run_snapshot (run);
}

static int
chain_complete (void *run, const char *group, json_t *info)
{
  return run_complete (run, group, info);
}

static void
chain_end (void *run, bool ok)
{
  run_end (run, ok);
}

static long
chain_seq (void *run)
{
  return ((struct run *) run)->seq;
}

static const char *
chain_snapshot_name (void *run)
{
  return ((struct run *) run)->name;
}

static json_t *
chain_record_json (void *run)
{
  struct run *r = run;

  return r->recorded
    ? json_array_get (r->runs, json_array_size (r->runs) - 1) : NULL;
}

const struct group_run_kind backup_chain_kind = {
  .new = chain_new,
  .where = chain_where,
  .open = NULL,
  .prepare = chain_prepare,
  .snapshot = chain_snapshot,
  .complete = chain_complete,
  .end = chain_end,
  .seq = chain_seq,
  .snapshot_name = chain_snapshot_name,
  .record_json = chain_record_json,
  .where_member = "directory",
};

int
cmd_backup (const struct backup_options *o, const char *dir_path)
{
  struct run *r = run_new (o, dir_path);
  int status;

  if (r == NULL)
    return EXIT_FAILED;
  status = run_prepare (r);
  if (status == EXIT_OK)
    status = run_snapshot (r);
  if (status == EXIT_OK)
    status = run_complete (r, NULL, NULL);
  /* A run that failed because the server went away says so (4), as a
   * run that could not reach it at all does.
   */
  if (status == EXIT_FAILED && run_lost_server (r))
    status = EXIT_UNREACHABLE;
  run_end (r, status == EXIT_OK);
  return status;
}

/* Drop a snapshot; with --cow-dir remove its store too. */
static int
drop_snapshot (struct run *r, const char *name)
{
  json_t *req = control_request (CONTROL_DROP);

  control_request_set_string (req, "name", name);
  if (server_request (r->o, req, "dropping snapshot", name) == -1)
    return -1;
  if (r->o->cow_dir) {
    char path[PATH_MAX + 128];
    snprintf (path, sizeof path, "%s/%s.cow", r->cow_dir, name);
    unlink (path);
  }
  return 0;
}
