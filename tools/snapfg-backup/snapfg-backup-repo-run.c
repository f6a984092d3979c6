/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: a backup run into a repository.
 *
 * Order of a run (docs/repository.md, "A run"):
 *   1. the repository opened, the key checked (a wrong key stops here,
 *      before the server is asked anything);
 *   2. the run registered as a writer (gc keeps what it references);
 *   3. a snapshot and a checkpoint at one instant, on the server;
 *   4. what to read: the chunks the checkpoint of the previous run says
 *      changed, and those verify found damaged; everything else is
 *      referenced from the previous run's index (its chunks touched);
 *      with no usable previous run, every data extent;
 *   5. the copy (the existing engine, snapfg-backup-copy.c): each chunk
 *      hashed, and unless stored already compressed, encrypted and
 *      stored, by several threads;
 *   6. the snapshot's drop asked for (its reply read after the index,
 *      so that the server's drop and the sync overlap); the chunks the
 *      run stored made durable and named in one pass
 *      (repo_sync: one syncfs for the directory back end, not an fsync
 *      each), every chunk the run references checked to exist, then the
 *      index written, last, with put if_absent (its number);
 *   7. the previous run's checkpoint dropped, the writer unregistered.
 * A run that stops before 6 leaves only chunks, which nothing trusts and
 * gc removes; its snapshot and checkpoint are dropped by the next run.
 *
 * The run is in phases, as a qcow2 chain's is (snapfg-backup-run.c):
 * open (1), prepare (2 and the server's size, connected), snapshot (3),
 * complete (4-7), end (what a failed run made dropped).  repo_cmd_backup
 * drives them for one disk; a backup of several disks at one instant,
 * or one with hooks, drives them through repo_run_kind
 * (snapfg-backup-group.c), every disk's snapshot taken while every
 * server holds its writes.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>
#include <sys/stat.h>

#include "snapfg-error.h"
#include "snapfg-backup-repo.h"

#define MAX_SOURCES 4
#define COPY_JOB_SLOTS 16       /* chunks in flight in the copy */
#define NAME_PREFIX "snapfg-repo-"

struct repo_run {
  struct repo_options *o;       /* the repository's options */
  struct backup_options *b;     /* the server: -S, -u, the session */
  const char *location;
  const char *disk;
  char owner[PATH_MAX];         /* the session's: LOCATION#DISK */
  struct repo *r;
  struct repo_writer *w;
  struct repo_index *base, *ix;
  uint64_t size;
  uint32_t cs;
  char prefix[128], name[160];
  struct nbd_handle *src[MAX_SOURCES];
  size_t nsrc;
  bool snapshot_made, checkpoint_made, committed;
  bool drop_pending;            /* its snapshot's drop sent, not answered */
  bool incremental;             /* read only what changed since base */
  struct copy_range *ranges;
  size_t nranges;
  unsigned char *sums;
  unsigned char *damaged;       /* ids verify found damaged, sorted */
  size_t ndamaged;
  bool *replaced;               /* per damaged id: stored again */
  int zstd_level;
  struct copy_job job;
  long run;                     /* its number once committed, else 0 */
  const char *group;            /* the runs taken at the same instant */
  json_t *group_info;           /* and what the index says of them */
  json_t *result;               /* what --json says of it, once done */
  /* Filled by the sink threads. */
  pthread_mutex_t lock;
  uint64_t bytes_added, chunks_added, chunks_reused, chunks_zero;
  json_t *stale_ckpts;
  json_t *dropped;              /* checkpoints of repositories gone */
  int64_t started;
  double t0;
};

static int
cmp_id (const void *a, const void *b)
{
  return memcmp (a, b, REPO_DIGEST_LEN);
}

static int
damaged_seen (void *opaque, const struct repo_object_info *info)
{
  struct repo_run *rr = opaque;
  unsigned char id[REPO_DIGEST_LEN], *p;

  if (repo_unhex (info->key + 8, id, sizeof id) == -1)
    return 0;
  p = realloc (rr->damaged, (rr->ndamaged + 1) * REPO_DIGEST_LEN);
  if (p == NULL)
    return -ENOMEM;
  rr->damaged = p;
  memcpy (p + rr->ndamaged++ * REPO_DIGEST_LEN, id, REPO_DIGEST_LEN);
  return 0;
}

/* Index of id among the damaged ones, or -1. */
static long
damaged_index (struct repo_run *rr, const unsigned char *id)
{
  unsigned char *p;

  if (rr->ndamaged == 0)
    return -1;
  p = bsearch (id, rr->damaged, rr->ndamaged, REPO_DIGEST_LEN, cmp_id);
  return p ? (p - rr->damaged) / REPO_DIGEST_LEN : -1;
}

static json_t *
server_call (struct repo_run *rr, json_t *req, const char *what)
{
  char err[512];
  json_t *reply = control_call (rr->b, req, err, sizeof err);

  json_decref (req);
  if (reply == NULL && what)
    backup_error ("%s: %s", what, err);
  return reply;
}

/* Drop snapshot or checkpoint NAME: true if the server did; a failure
 * is a warning (the next run tries again).
 */
static bool
drop (struct repo_run *rr, enum control_cmd cmd, const char *name)
{
  json_t *req = control_request (cmd), *reply;
  char what[256];

  control_request_set_string (req, "name", name);
  snprintf (what, sizeof what, "warning: dropping %s %s",
            cmd == CONTROL_DROP ? "snapshot" : "checkpoint", name);
  reply = server_call (rr, req, what);
  json_decref (reply);
  return reply != NULL;
}

/* The run's snapshot is dropped while the run commits: the server's
 * drop (its catalogue written and synced, the COW file removed: 10-25 ms
 * measured) and the repository's sync and index then overlap.  The
 * reply is read by drop_snapshot_finish, before any other request.
 */
static void
drop_snapshot_start (struct repo_run *rr)
{
  json_t *req = control_request (CONTROL_DROP);
  char err[512];

  control_request_set_string (req, "name", rr->name);
  if (control_send (rr->b, req, err, sizeof err) == -1)
    backup_error ("warning: dropping snapshot %s: %s", rr->name, err);
  else
    rr->drop_pending = true;
  json_decref (req);
  rr->snapshot_made = false;
}

static void
drop_snapshot_finish (struct repo_run *rr)
{
  char err[512];

  if (!rr->drop_pending)
    return;
  rr->drop_pending = false;
  json_t *reply = control_receive (rr->b, "drop", err, sizeof err);
  if (reply == NULL)
    backup_error ("warning: dropping snapshot %s: %s", rr->name, err);
  json_decref (reply);
}

/* Is the writer whose id starts the tail of name (after prefix) live? */
static bool
owned_by_live_writer (const char *name, const char *prefix, json_t *writers)
{
  const char *tail = name + strlen (prefix);
  json_t *v;
  size_t i;

  json_array_foreach (writers, i, v) {
    const char *id = json_string_value (json_object_get (v, "id"));
    if (id && strncmp (id, tail, 8) == 0 && strlen (tail) == 8)
      return true;
  }
  return false;
}

/* Of the snapshots or checkpoints in REPLY's KEY, those of this disk
 * that no live run owns.
 */
static json_t *
leftovers_in (struct repo_run *rr, json_t *reply, const char *key)
{
  json_t *out = json_array (), *v, *writers = NULL;
  size_t nw, i;
  int64_t oldest;

  if (reply == NULL)
    return out;
  repo_live_writers (rr->r, &nw, &oldest, &writers);
  json_array_foreach (json_object_get (reply, key), i, v) {
    const char *n = json_str (v, "name");
    if (n && strncmp (n, rr->prefix, strlen (rr->prefix)) == 0 &&
        !owned_by_live_writer (n, rr->prefix, writers))
      json_array_append_new (out, json_string (n));
  }
  json_decref (writers);
  return out;
}

/* Is checkpoint V (an entry of the server's list) one of a repository
 * deleted by hand?  Only the host that made it can tell, and only for a
 * directory: named for another repository, made on this host (its
 * owner is "HOST:PATH#DISK", see snapfgctl checkpoint list) for a
 * directory PATH that is gone or now holds another repository.  Without
 * this, such checkpoints stay on the server for good, each tracking
 * every write.  A directory that exists without a readable repository
 * (a file system not mounted yet, a damaged config) keeps them, and so
 * does an S3 repository: its runs, or snapfgctl checkpoint drop, end
 * them.
 */
static bool
of_repository_gone (struct repo_run *rr, json_t *v)
{
  const char *n = json_str (v, "name"), *owner = json_str (v, "owner");
  const char *colon, *hash;
  char host[256] = "", path[PATH_MAX], id[9] = "";
  struct repo *other;
  struct stat st;
  size_t len;
  bool gone;

  if (n == NULL || owner == NULL ||
      strncmp (n, NAME_PREFIX, strlen (NAME_PREFIX)) != 0 ||
      sscanf (n + strlen (NAME_PREFIX), "%8[0-9a-f]-", id) != 1 ||
      strlen (id) != 8 || strncmp (id, repo_get_id (rr->r), 8) == 0 ||
      (colon = strchr (owner, ':')) == NULL ||
      (hash = strrchr (colon, '#')) == NULL)
    return false;
  gethostname (host, sizeof host - 1);
  len = hash - colon - 1;
  if ((size_t) (colon - owner) != strlen (host) ||
      strncmp (owner, host, colon - owner) != 0 ||
      colon[1] != '/' || strstr (colon, "://") || len >= sizeof path)
    return false;
  memcpy (path, colon + 1, len);
  path[len] = '\0';
  if (lstat (path, &st) == -1)
    return errno == ENOENT;
  if (!S_ISDIR (st.st_mode))
    return false;
  if (repo_open (path, NULL, NULL, &other) < 0) {
    snapfg_clear_error ();
    return false;
  }
  gone = strncmp (repo_get_id (other), id, 8) != 0;
  repo_close (other);
  return gone;
}

/* Drop the checkpoints in REPLY of repositories deleted by hand. */
static void
drop_orphans (struct repo_run *rr, json_t *reply)
{
  json_t *v;
  size_t i;

  json_array_foreach (json_object_get (reply, "checkpoints"), i, v) {
    if (!of_repository_gone (rr, v) ||
        !drop (rr, CONTROL_CHECKPOINT_DROP, json_str (v, "name")))
      continue;
    if (rr->dropped == NULL)
      rr->dropped = json_array ();
    json_array_append_new (rr->dropped, json_string (json_str (v, "name")));
    if (!tool_out.json)
      backup_info ("dropped checkpoint %s (made for %s, no longer a "
                   "repository of that id)", json_str (v, "name"),
                   json_str (v, "owner"));
  }
}

/* The copy engine's sink: one chunk, hashed already (job->sums). */
static int
store_chunk (struct copy_job *job, uint64_t offset, const char *buf,
             uint64_t len, const bool *zero, size_t nblocks,
             uint64_t *stored)
{
  struct repo_run *rr = job->sink_opaque;
  uint64_t n = offset / rr->cs;
  unsigned char *id = repo_index_digest (rr->ix, n);
  long d;
  int ret;

  *stored = 0;
  if (nblocks != 1 || offset % rr->cs) {
    backup_error ("internal error: a piece of %" PRIu64 " bytes at %" PRIu64
                  " is not one chunk", len, offset);
    return EIO;
  }
  if (zero[0]) {
    memset (id, 0, REPO_DIGEST_LEN);
    pthread_mutex_lock (&rr->lock);
    rr->chunks_zero++;
    pthread_mutex_unlock (&rr->lock);
    return 0;
  }
  repo_chunk_id (repo_get_keys (rr->r), job->sums + n * SHA256_LEN, id);
  d = damaged_index (rr, id);
  snapfg_clear_error ();
  ret = repo_put_chunk (rr->r, id, buf, job->headroom, len, rr->zstd_level,
                        d >= 0, stored);
  if (ret < 0) {
    backup_error ("storing chunk %" PRIu64 " (offset %" PRIu64 "): %s", n,
                  offset, snapfg_get_error () ? snapfg_get_error ()
                  : strerror (-ret));
    return -ret;
  }
  pthread_mutex_lock (&rr->lock);
  if (ret == 0) {
    rr->chunks_added++;
    rr->bytes_added += *stored;
  }
  else
    rr->chunks_reused++;
  if (d >= 0)
    rr->replaced[d] = true;
  pthread_mutex_unlock (&rr->lock);
  return 0;
}

/* Add chunk n to the ranges to read. */
static int
add_chunk_range (struct repo_run *rr, uint64_t n, size_t *cap)
{
  if (rr->nranges == *cap) {
    struct copy_range *p = realloc (rr->ranges,
                                    (*cap = *cap * 2 + 64) * sizeof *p);
    if (p == NULL)
      return -1;
    rr->ranges = p;
  }
  rr->ranges[rr->nranges++] = (struct copy_range) {
    n * rr->cs, (n + 1) * rr->cs > rr->size ? rr->size - n * rr->cs : rr->cs
  };
  return 0;
}

/* 4. What to read.  Returns 0 or an exit status. */
static int
find_ranges (struct repo_run *rr)
{
  struct backup_options *b = rr->b;
  json_t *meta = rr->base ? repo_index_meta (rr->base) : NULL;
  const char *since = json_str (meta, "checkpoint");
  uint64_t nchunks = repo_index_chunks (rr->ix);
  size_t cap;
  bool *read;

  if (open_export (rr->src[0], b->session->data_what, rr->name) == -1)
    return EXIT_FAILED;
  if ((uint64_t) nbd_get_size (rr->src[0]) != rr->size) {
    backup_error ("export %s: %" PRId64 " bytes, the origin %" PRIu64,
                  rr->name, nbd_get_size (rr->src[0]), rr->size);
    return EXIT_FAILED;
  }
  if (rr->base && !b->full && since &&
      repo_index_disk_size (rr->base) == rr->size &&
      repo_index_chunk_size (rr->base) == rr->cs) {
    json_t *req = control_request (CONTROL_CHANGED), *reply, *v;
    char err[512];
    size_t i;

    control_request_set_string (req, "since", since);
    control_request_set_string (req, "name", rr->name);
    reply = control_call (b, req, err, sizeof err);
    json_decref (req);
    if (reply) {
      json_t *a = json_object_get (reply, "ranges");
      rr->ranges = malloc ((json_array_size (a) + 1) * sizeof *rr->ranges);
      if (rr->ranges == NULL) {
        json_decref (reply);
        backup_error ("out of memory");
        return EXIT_FAILED;
      }
      json_array_foreach (a, i, v)
        rr->ranges[rr->nranges++] = (struct copy_range) {
          json_u64 (v, "offset"), json_u64 (v, "length") };
      json_decref (reply);
      rr->nranges = normalise_ranges (rr->ranges, rr->nranges, rr->cs,
                                      rr->size);
      memcpy (repo_index_digest (rr->ix, 0), repo_index_digest (rr->base, 0),
              nchunks * REPO_DIGEST_LEN);
      /* The chunks kept from the previous run: touched (gc), and read
       * again when damaged or gone.
       */
      read = calloc (nchunks ? nchunks : 1, sizeof *read);
      if (read == NULL) {
        backup_error ("out of memory");
        return EXIT_FAILED;
      }
      for (i = 0; i < rr->nranges; ++i)
        for (uint64_t n = rr->ranges[i].offset / rr->cs;
             n * rr->cs < rr->ranges[i].offset + rr->ranges[i].length; ++n)
          read[n] = true;
      cap = rr->nranges;
      for (uint64_t n = 0; n < nchunks; ++n) {
        unsigned char *id = repo_index_digest (rr->ix, n);
        char key[REPO_CHUNK_KEY_LEN];
        struct repo_store *s = repo_get_store (rr->r);
        int t;

        if (read[n] || repo_digest_is_zero (id))
          continue;
        repo_chunk_key (id, key);
        t = damaged_index (rr, id) >= 0 ? -ENOENT : s->ops->touch (s, key);
        if (t == -ENOENT) {
          if (add_chunk_range (rr, n, &cap) == -1) {
            free (read);
            backup_error ("out of memory");
            return EXIT_FAILED;
          }
        }
        else if (t < 0) {
          free (read);
          return repo_fail (t, "keeping the previous run's chunks");
        }
      }
      free (read);
      rr->nranges = normalise_ranges (rr->ranges, rr->nranges, rr->cs,
                                      rr->size);
      rr->incremental = true;
      return 0;
    }
    backup_info ("changes since run %ld cannot be known (%s): reading the "
                 "whole disk", repo_index_run (rr->base), err);
  }
  return data_ranges (rr->src[0], rr->size, rr->cs, &rr->ranges,
                      &rr->nranges) == -1 ? EXIT_FAILED : 0;
}

/* 6. Every chunk the index names is there (a gc with too short a
 * --grace could have removed one), then the index.
 */
static int
commit (struct repo_run *rr)
{
  struct copy_job *job = &rr->job;
  struct repo_store *s = repo_get_store (rr->r);
  json_t *meta = repo_index_meta (rr->ix);
  char host[256] = "";
  uint64_t n;
  int ret;

  /* The chunks this run stored, durable and named, in one pass. */
  snapfg_clear_error ();
  if ((ret = repo_sync (rr->r)) < 0) {
    repo_fail (ret, "syncing the run's chunks");
    return -1;
  }
  for (n = 0; n < repo_index_chunks (rr->ix); ++n) {
    unsigned char *id = repo_index_digest (rr->ix, n);
    struct repo_object_info info;
    char key[REPO_CHUNK_KEY_LEN];

    if (repo_digest_is_zero (id))
      continue;
    repo_chunk_key (id, key);
    if ((ret = s->ops->head (s, key, &info)) < 0) {
      backup_error ("%s/%s: %s: the run is not recorded; run the backup "
                    "again", rr->location, key,
                    ret == -ENOENT ? "removed during the run (a gc with "
                    "too short a --grace?)" : snapfg_get_error ());
      return -1;
    }
  }
  gethostname (host, sizeof host - 1);
  json_object_set_new (meta, "time", json_integer (rr->started));
  json_object_set_new (meta, "finished", json_integer (repo_run_time ()));
  json_object_set_new (meta, "checkpoint", json_string (rr->name));
  json_object_set_new (meta, "host", json_string (host));
  json_object_set_new (meta, "type", json_string (rr->incremental
                                                  ? "incremental" : "full"));
  if (rr->base)
    json_object_set_new (meta, "base", json_integer (repo_index_run
                                                     (rr->base)));
  json_object_set_new (meta, "bytes_read", json_integer (job->bytes_read));
  json_object_set_new (meta, "bytes_added", json_integer (rr->bytes_added));
  json_object_set_new (meta, "chunks_added", json_integer (rr->chunks_added));
  json_object_set_new (meta, "chunks_reused",
                       json_integer (rr->chunks_reused));
  json_object_set_new (meta, "compression",
                       rr->zstd_level ? json_string ("zstd") : json_null ());
  if (rr->group) {
    json_object_set_new (meta, "group", json_string (rr->group));
    if (rr->group_info)
      json_object_update (meta, rr->group_info);
  }
  snapfg_clear_error ();
  if ((ret = repo_index_commit (rr->r, rr->ix, &rr->run)) < 0) {
    repo_fail (ret, "writing the run's index");
    return -1;
  }
  rr->committed = true;
  return 0;
}

static void
cleanup (struct repo_run *rr)
{
  for (size_t i = 0; i < rr->nsrc; ++i)
    disconnect (rr->src[i]);
  rr->nsrc = 0;
  drop_snapshot_finish (rr);
  if (rr->snapshot_made)
    drop (rr, CONTROL_DROP, rr->name);
  rr->snapshot_made = false;
  if (rr->checkpoint_made && !rr->committed)
    drop (rr, CONTROL_CHECKPOINT_DROP, rr->name);
  rr->checkpoint_made = false;
}

/* --- the phases --- */

static void *
repo_run_new (struct repo_options *o, struct backup_options *b,
              const char *location, const char *disk)
{
  struct repo_run *rr = calloc (1, sizeof *rr);

  if (rr == NULL) {
    backup_error ("out of memory");
    return NULL;
  }
  rr->o = o;
  rr->b = b;
  rr->location = location;
  rr->disk = disk;
  snprintf (rr->owner, sizeof rr->owner, "%s#%s", location, disk);
  pthread_mutex_init (&rr->lock, NULL);
  return rr;
}

/* 1. The repository and its key, before anything else. */
static int
repo_run_open (void *run)
{
  struct repo_run *rr = run;
  int status;

  if ((status = repo_open_for (rr->o, rr->location, true, &rr->r)) != 0)
    return status;
  if (!repo_disk_name_ok (rr->disk)) {
    backup_error ("--disk %s: a disk's name is 1 to %d of A-Z a-z 0-9 . _ - "
                  "(not starting with .)", rr->disk, REPO_DISK_NAME_MAX);
    return EXIT_USAGE;
  }
  rr->cs = repo_get_chunk_size (rr->r);
  rr->zstd_level = rr->o->compress ? 1 : 0;
  return EXIT_OK;
}

/* 2, and of 3 what comes before the snapshot: the server's size, our
 * leftovers dropped, the connection to its NBD server.
 */
static int
repo_run_prepare (void *run)
{
  struct repo_run *rr = run;
  struct backup_options *b = rr->b;
  json_t *req, *reply, *v, *snaps;
  char err[1024];
  int ret;
  size_t i;

  /* 2. Registered before any chunk is referenced. */
  snapfg_clear_error ();
  if ((ret = repo_writer_start (rr->r, rr->disk, &rr->w)) < 0) {
    repo_fail (ret, "registering the run");
    return EXIT_FAILED;
  }
  snprintf (rr->prefix, sizeof rr->prefix, NAME_PREFIX "%.8s-%s-",
            repo_get_id (rr->r), rr->disk);
  snprintf (rr->name, sizeof rr->name, "%s%.8s", rr->prefix,
            repo_writer_id (rr->w));
  snapfg_clear_error ();
  ret = repo_index_load (rr->r, rr->disk, 0, &rr->base);
  if (ret < 0 && ret != -ENOENT) {
    if (!b->full) {
      repo_fail (ret, "the previous run");
      backup_error ("run with --full to back up the whole disk without it");
      return EXIT_NEED_FULL;
    }
    rr->base = NULL;
  }
  if (repo_get_store (rr->r)->ops->list (repo_get_store (rr->r), "damaged/",
                                         damaged_seen, rr) < 0) {
    backup_error ("%s: cannot list damaged chunks", rr->location);
    return EXIT_FAILED;
  }
  if (rr->ndamaged > 1)
    qsort (rr->damaged, rr->ndamaged, REPO_DIGEST_LEN, cmp_id);
  rr->replaced = calloc (rr->ndamaged + 1, sizeof *rr->replaced);
  if (rr->replaced == NULL) {
    backup_error ("out of memory");
    return EXIT_FAILED;
  }

  /* 3. The server: the origin's size, our leftovers, the connection. */
  req = control_request (CONTROL_STATUS);
  reply = control_call (b, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("%s", err);
    return control_failure_status (b);
  }
  rr->size = json_u64 (json_object_get (reply, "origin"), "size");
  /* The same status names the snapshots: no second request. */
  snaps = leftovers_in (rr, reply, "snapshots");
  json_decref (reply);
  if (rr->size == 0) {
    json_decref (snaps);
    backup_error ("the server reports an empty origin: nothing to back up");
    return EXIT_FAILED;
  }
  json_array_foreach (snaps, i, v) {
    backup_info ("dropping snapshot %s, left by an interrupted run",
                 json_string_value (v));
    drop (rr, CONTROL_DROP, json_string_value (v));
  }
  json_decref (snaps);
  if (repo_index_new (rr->disk, rr->size, rr->cs, &rr->ix) < 0 ||
      (rr->sums = calloc (repo_index_chunks (rr->ix) + 1,
                          SHA256_LEN)) == NULL) {
    backup_error ("out of memory");
    return EXIT_FAILED;
  }
  rr->src[0] = connect_server (b->session->data_uri,
                               b->session->data_what, true);
  if (rr->src[0] == NULL)
    return EXIT_UNREACHABLE;
  rr->nsrc = 1;
  return EXIT_OK;
}

/* 3. The snapshot and the checkpoint, at one instant (with several
 * disks, while every server holds its writes).
 */
static int
repo_run_snapshot (void *run)
{
  struct repo_run *rr = run;
  json_t *req, *reply;
  char err[1024];

  req = control_request (CONTROL_CREATE);
  control_request_set_string (req, "name", rr->name);
  control_request_set_string (req, "checkpoint", rr->name);
  control_request_set_string (req, "checkpoint_owner", rr->b->session->owner);
  /* The snapshot serves this run only: should the server die during
   * it, it is dropped at the server's next start rather than kept
   * copying out every first write until this disk's next run.
   */
  control_request_set (req, "temporary", json_true ());
  rr->started = repo_run_time ();
  rr->t0 = tool_now ();
  reply = control_call (rr->b, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("creating snapshot and checkpoint %s: %s (snapfg-backup "
                  "needs a server started with state=FILE and "
                  "control=SOCKET)", rr->name, err);
    return control_failure_status (rr->b);
  }
  json_decref (reply);
  rr->snapshot_made = rr->checkpoint_made = true;
  return EXIT_OK;
}

/* Is the copy worth more connections than the first?  Each costs a
 * handshake and a disconnect, one after another (2-10 ms each, measured
 * with strace -ttt), and the server's threads for it, while a copy that
 * fits in the requests one connection has in flight at once
 * (COPY_JOB_SLOTS chunks) gains nothing from them: an incremental of 6
 * chunks took the server 30-60 ms of CPU through one connection, 70-80
 * ms through 4 (/proc/PID/stat, 6 runs each), the tool's the same.
 */
static bool
wants_connections (struct repo_run *rr)
{
  uint64_t bytes = 0;

  for (size_t i = 0; i < rr->nranges; ++i)
    bytes += rr->ranges[i].length;
  return bytes > (uint64_t) COPY_JOB_SLOTS * rr->cs;
}

/* What the run says when it is done: a line, or with --json its object
 * (in a group, the group prints one document with every disk's).
 */
static void
report (struct repo_run *rr)
{
  double secs = tool_now () - rr->t0;
  json_t *meta = repo_index_meta (rr->ix);
  char rate[128];

  tool_format_rate (rate, sizeof rate, rr->job.bytes_read, secs);
  rr->result = json_pack ("{s:s, s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:I,"
                          " s:f}",
                          "disk", rr->disk,
                          "run", (int) rr->run,
                          "type", json_str (meta, "type"),
                          "size", (json_int_t) rr->size,
                          "bytes_read", (json_int_t) rr->job.bytes_read,
                          "bytes_added", (json_int_t) rr->bytes_added,
                          "chunks_added", (json_int_t) rr->chunks_added,
                          "chunks_reused", (json_int_t) rr->chunks_reused,
                          "chunks_zero", (json_int_t) rr->chunks_zero,
                          "seconds", secs);
  if (rr->result && rr->group)
    json_object_set_new (rr->result, "group", json_string (rr->group));
  if (rr->result && rr->dropped)
    json_object_set (rr->result, "dropped_checkpoints", rr->dropped);
  if (tool_out.json) {
    json_t *o = rr->result ? json_deep_copy (rr->result) : NULL;

    if (o) {
      json_object_set_new (o, "command", json_string ("backup"));
      json_object_set_new (o, "repository", json_string (rr->location));
    }
    tool_json_result (o, 0);
  }
  else if (rr->b->json)
    backup_info ("disk %s run %ld (%s): read %s, added %" PRIu64 " bytes "
                 "in %" PRIu64 " new chunks (%" PRIu64 " reused)", rr->disk,
                 rr->run, json_str (meta, "type"), rate, rr->bytes_added,
                 rr->chunks_added, rr->chunks_reused);
  else
    printf ("snapfg-backup: disk %s run %ld (%s): read %s, added %" PRIu64
            " bytes in %" PRIu64 " new chunks (%" PRIu64 " reused)\n",
            rr->disk, rr->run, json_str (meta, "type"), rate,
            rr->bytes_added, rr->chunks_added, rr->chunks_reused);
}

/* 4-7: what to read, the copy, the index (naming GROUP, if not NULL,
 * with INFO's members), what the run no longer needs.
 */
static int
repo_run_complete (void *run, const char *group, json_t *info)
{
  struct repo_run *rr = run;
  struct copy_job *job = &rr->job;
  json_t *v, *reply;
  char err[1024];
  int status;
  size_t i;

  rr->group = group;
  rr->group_info = info;

  /* 4. What to read. */
  if ((status = find_ranges (rr)) != 0)
    return status;

  /* 5. The copy. */
  if (nbd_can_multi_conn (rr->src[0]) == 1 && wants_connections (rr))
    rr->nsrc += connect_exports (rr->b->session->data_uri,
                                 rr->b->session->data_what, rr->name,
                                 rr->src + rr->nsrc, MAX_SOURCES - rr->nsrc);
  memset (job, 0, sizeof *job);
  job->src = rr->src;
  job->nsrc = rr->nsrc;
  job->ranges = rr->ranges;
  job->nranges = rr->nranges;
  job->size = rr->size;
  job->block = rr->cs;
  job->piece = rr->cs;
  /* A chunk in 256 KiB reads, as nbdcopy's requests: in one 4 MiB
   * read, nbdkit spent 4 times the CPU time on the same data (1.2-1.5 s
   * against 0.3 s for a 512 MiB disk, paired runs), and on a loaded
   * machine that CPU time was the run's wall time.
   */
  job->request = 256 * 1024;
  job->slots = COPY_JOB_SLOTS;
  job->threads = rr->o->threads ? rr->o->threads : REPO_DEFAULT_THREADS;
  job->sums = rr->sums;
  job->sink = store_chunk;
  job->sink_opaque = rr;
  job->headroom = REPO_PUT_HEADROOM;
  job->what = "backup into the repository";
  job->rate = rr->b->limit_rate;
  if (getenv ("SNAPFG_BACKUP_TEST_STOP_AFTER"))
    job->stop_after = strtoull (getenv ("SNAPFG_BACKUP_TEST_STOP_AFTER"),
                                NULL, 10);
  if (copy_run (job, err, sizeof err) == -1) {
    backup_error ("backup of snapshot %s failed: %s", rr->name, err);
    return EXIT_FAILED;
  }
  test_pause ("after-copy");
  disconnect_all (rr->src, rr->nsrc);
  rr->nsrc = 0;
  drop_snapshot_start (rr);

  /* 6. The index, last. */
  if (commit (rr) == -1)
    return EXIT_FAILED;
  drop_snapshot_finish (rr);

  /* 7. What the run no longer needs. */
  for (i = 0; i < rr->ndamaged; ++i)
    if (rr->replaced[i]) {
      char key[REPO_CHUNK_KEY_LEN];
      repo_damaged_key (rr->damaged + i * REPO_DIGEST_LEN, key);
      repo_get_store (rr->r)->ops->del (repo_get_store (rr->r), key);
    }
  /* Every checkpoint of this disk but this run's and those of runs still
   * going: the latest run's is this one's (the runs of a disk are
   * numbered in the order they finish), and a run that finishes later
   * drops this one's in turn.
   */
  reply = server_call (rr, control_request (CONTROL_CHECKPOINT_LIST), NULL);
  rr->stale_ckpts = leftovers_in (rr, reply, "checkpoints");
  json_array_foreach (rr->stale_ckpts, i, v)
    if (strcmp (json_string_value (v), rr->name) != 0)
      drop (rr, CONTROL_CHECKPOINT_DROP, json_string_value (v));
  /* And those of repositories deleted by hand (D12 of the chains). */
  if (reply)
    drop_orphans (rr, reply);
  json_decref (reply);
  report (rr);
  return EXIT_OK;
}

/* A run that did not commit leaves no snapshot and no checkpoint (those
 * the server can no longer be asked to drop, the next run does).
 */
static void
repo_run_end (void *run, bool ok)
{
  struct repo_run *rr = run;

  if (rr == NULL)
    return;
  cleanup (rr);
  repo_writer_end (rr->w);
  repo_index_free (rr->base);
  repo_index_free (rr->ix);
  json_decref (rr->stale_ckpts);
  json_decref (rr->dropped);
  json_decref (rr->result);
  free (rr->ranges);
  free (rr->sums);
  free (rr->damaged);
  free (rr->replaced);
  repo_close (rr->r);
  pthread_mutex_destroy (&rr->lock);
  free (rr);
}

int
repo_cmd_backup (struct repo_options *o, const char *location)
{
  struct repo_run *rr = repo_run_new (o, &o->b, location, o->disk);
  bool session = false;
  int status;

  if (rr == NULL)
    return EXIT_FAILED;
  status = repo_run_open (rr);
  if (status == EXIT_OK) {
    status = session_open (&o->b, rr->owner);
    session = true;
  }
  if (status == EXIT_OK)
    status = repo_run_prepare (rr);
  if (status == EXIT_OK)
    status = repo_run_snapshot (rr);
  if (status == EXIT_OK)
    status = repo_run_complete (rr, NULL, NULL);
  repo_run_end (rr, status == EXIT_OK);
  if (session)
    session_close (&o->b);
  return status;
}

/* --- a repository's run in a group (snapfg-backup-group.c) --- */

static void *
kind_new (void *opaque, struct backup_options *o, const char *repo,
          const char *name, bool several)
{
  return repo_run_new (opaque, o, repo, name);
}

static const char *
kind_where (void *run)
{
  return ((struct repo_run *) run)->owner;
}

/* Until its index is written, the number it expects: one more than the
 * disk's latest (another run of the disk that finishes first takes it).
 */
static long
kind_seq (void *run)
{
  struct repo_run *rr = run;

  if (rr->run)
    return rr->run;
  return rr->base ? repo_index_run (rr->base) + 1 : 1;
}

static const char *
kind_snapshot_name (void *run)
{
  return ((struct repo_run *) run)->name;
}

static json_t *
kind_record_json (void *run)
{
  return ((struct repo_run *) run)->result;
}

const struct group_run_kind repo_run_kind = {
  .new = kind_new,
  .where = kind_where,
  .open = repo_run_open,
  .prepare = repo_run_prepare,
  .snapshot = repo_run_snapshot,
  .complete = repo_run_complete,
  .end = repo_run_end,
  .seq = kind_seq,
  .snapshot_name = kind_snapshot_name,
  .record_json = kind_record_json,
  .where_member = NULL,
};

int
repo_cmd_backup_group (struct repo_options *o, const char *location)
{
  return backup_group (&o->b, location, &repo_run_kind, o);
}
