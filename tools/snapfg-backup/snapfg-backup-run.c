/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the backup command, one run.
 *
 * A snapshot and a checkpoint at one instant, the copy of the snapshot
 * (all its data, or what changed since the previous run's checkpoint)
 * into a new qcow2 image, the run recorded in the manifest, the older
 * checkpoint dropped; the crash-safe order is at the top of
 * snapfg-backup.c.  On failure the server is left as the run found it.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>

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

/* Drop a snapshot; with --cow-dir remove its store too. */
static int
drop_snapshot (const struct backup_options *o, const char *name)
{
  json_t *req = control_request (CONTROL_DROP);

  control_request_set_string (req, "name", name);
  if (server_request (o, req, "dropping snapshot", name) == -1)
    return -1;
  if (o->cow_dir) {
    char path[PATH_MAX];
    snprintf (path, sizeof path, "%s/%s.cow", o->cow_dir, name);
    unlink (path);
  }
  return 0;
}

static int
drop_checkpoint (const struct backup_options *o, const char *name)
{
  json_t *req = control_request (CONTROL_CHECKPOINT_DROP);

  control_request_set_string (req, "name", name);
  return server_request (o, req, "warning: dropping checkpoint", name);
}

/* Names of the server's snapshots or checkpoints that start with PREFIX. */
static json_t *
server_names (const struct backup_options *o, enum control_cmd cmd,
              const char *key, const char *prefix)
{
  json_t *req = control_request (cmd);
  json_t *reply, *out = json_array (), *v;
  char err[512];
  size_t i;

  reply = control_call (o, req, err, sizeof err);
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

int
cmd_backup (const struct backup_options *o, const char *dir_path)
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
  double t0;
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
  req = control_request (CONTROL_STATUS);
  reply = control_call (o, req, err, sizeof err);
  json_decref (req);
  if (reply == NULL) {
    backup_error ("%s", err);
    status = control_failure_status (o);
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
    /* Blocks the copy skips (holes) read as zero. */
    sums = sums_new_zero (block, size);
    if (sums == NULL) {
      backup_error ("out of memory");
      goto out;
    }
  }
  /* Checkpoints of this chain other than the one the manifest names are
   * leftovers; they are dropped once this run is recorded (dropping
   * them now could only matter to an older checkpoint, and keeping them
   * until then keeps "changed since" exact whatever the server does).
   */
  stale_ckpts = server_names (o, CONTROL_CHECKPOINT_LIST, "checkpoints",
                              prefix);

  /* The NBD server must be reachable (address, TLS) before anything is
   * changed on it.
   */
  src[0] = connect_server (o->session->data_uri, !incremental);
  if (src[0] == NULL) {
    status = EXIT_UNREACHABLE;
    goto out;
  }
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
  req = control_request (CONTROL_CREATE);
  control_request_set_string (req, "name", name);
  control_request_set_string (req, "checkpoint", name);
  control_request_set_string (req, "checkpoint_owner", o->session->owner);
  if (o->cow_dir) {
    snprintf (cow_path, sizeof cow_path, "%s/%s.cow", o->cow_dir, name);
    control_request_set_string (req, "cow", cow_path);
  }
  started = time (NULL);
  t0 = tool_now ();
  reply = control_call (o, req, err, sizeof err);
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
  if (open_export (src[0], o->session->data_uri, name) == -1)
    goto out;
  if ((uint64_t) nbd_get_size (src[0]) != size) {
    backup_error ("export %s: %" PRId64 " bytes, the origin %" PRIu64,
                  name, nbd_get_size (src[0]), size);
    goto out;
  }
  if (incremental) {
    json_t *a;
    req = control_request (CONTROL_CHANGED);
    control_request_set_string (req, "since", since);
    control_request_set_string (req, "name", name);
    reply = control_call (o, req, err, sizeof err);
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
      src[nsrc] = connect_export (o->session->data_uri, name);
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

  backup_report_run (run, dir_path, tool_now () - t0);

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
