/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the verify and list commands.
 *
 * verify reads a run's whole chain (checked against the manifest first)
 * through qemu-nbd and compares every block with the run's block sums,
 * without writing a disk anywhere; a run that passes is marked
 * "verified" (with the time) in the manifest.  list shows the runs the
 * manifest records.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <fcntl.h>
#include <time.h>
#include <limits.h>
#include <unistd.h>
#include <sys/stat.h>

#include "rounding.h"
#include "snapfg-backup.h"

int
sums_compare (const unsigned char *got, const unsigned char *expected,
              json_t *run, const char *label)
{
  uint64_t block = json_u64 (run, "sum_block");
  uint64_t nb = div_round_up (json_u64 (run, "size"), block);

  for (uint64_t b = 0; b < nb; ++b)
    if (memcmp (got + b * SHA256_LEN, expected + b * SHA256_LEN,
                SHA256_LEN) != 0) {
      backup_error ("%s differs from run %" PRIu64 " at offset %" PRIu64
                    " (block of %" PRIu64 " bytes): the backup chain is "
                    "damaged", label, json_u64 (run, "seq"), b * block, block);
      return -1;
    }
  return 0;
}

int
verify_disk (struct nbd_handle *h, json_t *run, const unsigned char *expected,
             const char *what, const char *label)
{
  uint64_t size = json_u64 (run, "size"), block = json_u64 (run, "sum_block");
  struct copy_range *ranges = NULL;
  unsigned char *got;
  struct copy_job job;
  size_t nranges;
  char err[1024];
  int r = -1;

  if ((uint64_t) nbd_get_size (h) != size) {
    backup_error ("%s: %" PRId64 " bytes, run %" PRIu64 " %" PRIu64, label,
                  nbd_get_size (h), json_u64 (run, "seq"), size);
    return -1;
  }
  got = sums_new_zero (block, size);
  if (got == NULL || data_ranges (h, size, block, &ranges, &nranges) == -1) {
    free (got);
    return -1;
  }
  memset (&job, 0, sizeof job);
  job.src = &h;
  job.nsrc = 1;
  job.ranges = ranges;
  job.nranges = nranges;
  job.size = size;
  job.block = block;
  job.sums = got;
  job.what = what;
  if (copy_run (&job, err, sizeof err) == -1)
    backup_error ("verifying %s: %s", label, err);
  else
    r = sums_compare (got, expected, run, label);
  free (ranges);
  free (got);
  return r;
}

static void
iso_now (char out[32])
{
  time_t t = time (NULL);
  struct tm tm;

  gmtime_r (&t, &tm);
  strftime (out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Verify one run: 0 when every block matches its sum. */
static int
verify_run (const struct backup_options *o, struct backup_dir *d,
            json_t *manifest, json_t *run)
{
  struct image_access a;
  struct nbd_handle *h;
  unsigned char *expected;
  char err[1024], **chain = NULL, label[PATH_MAX + 1024];
  int depth, r;

  if (json_is_true (json_object_get (run, "pruning"))) {
    backup_error ("run %" PRIu64 " is being pruned (an interrupted prune): "
                  "run prune again", json_u64 (run, "seq"));
    return -1;
  }
  expected = run_sums (d->fd, d->path, run, err, sizeof err);
  if (expected == NULL) {
    backup_error ("%s", err);
    return -1;
  }
  if (run_access (o, run, &a) == -1 ||
      (depth = chain_check (d->fd, d->path, manifest, run, &chain)) < 0) {
    free (expected);
    return -1;
  }
  h = image_open (d->path, chain[0], depth, &a, true);
  /* The message names the files: the run's image and those under it. */
  snprintf (label, sizeof label, "run %" PRIu64 "'s image chain (%s/%s",
            json_u64 (run, "seq"), d->path, chain[0]);
  for (int i = 1; i < depth; ++i)
    snprintf (label + strlen (label), sizeof label - strlen (label),
              "%s%s", i == 1 ? " over " : ", ", chain[i]);
  snprintf (label + strlen (label), sizeof label - strlen (label), ")");
  chain_free (chain);
  r = h ? verify_disk (h, run, expected, "verify", label) : -1;
  disconnect (h);
  free (expected);
  return r;
}

/* Is RUN (index I of RUNS) one that verify checks? */
static bool
verify_selected (const struct backup_options *o, json_t *runs, size_t i,
                 json_t *run)
{
  return o->all ? true
    : o->at > 0 ? json_u64 (run, "seq") == (uint64_t) o->at
    : i + 1 == json_array_size (runs);
}

int
cmd_verify (const struct backup_options *o, const char *dir_path)
{
  struct backup_dir d;
  json_t *manifest, *runs, *run, *out = json_array ();
  char err[1024], when[32];
  bool missing, recorded = false;
  size_t i, failed = 0, checked = 0;

  if (open_backup_dir (dir_path, false, &d) == -1)
    return EXIT_FAILED;
  /* verify records its result in the manifest: the rules of a writer. */
  if (check_private_dir (&d) == -1 || lock_backup_dir (&d) == -1) {
    close (d.fd);
    return EXIT_FAILED;
  }
  manifest = manifest_read (d.fd, dir_path, &missing, err, sizeof err);
  if (manifest == NULL) {
    backup_error ("%s", missing ? "no manifest.json: not a snapfg-backup "
                  "directory" : err);
    close (d.fd);
    close (d.lock_fd);
    return EXIT_FAILED;
  }
  runs = json_object_get (manifest, "runs");
  if (json_array_size (runs) == 0)
    backup_error ("%s: the manifest records no run yet", dir_path), failed++;
  else if (o->at > 0 && manifest_run (manifest, o->at) == NULL)
    backup_error ("%s: no run %ld", dir_path, o->at), failed++;
  /* A key missing for any run to verify is a usage error, before
   * any is read (the same status as from every other command).
   */
  json_array_foreach (runs, i, run)
    if (verify_selected (o, runs, i, run) &&
        key_status (o, run) != EXIT_OK) {
      json_decref (out);
      json_decref (manifest);
      close (d.fd);
      close (d.lock_fd);
      return EXIT_USAGE;
    }
  iso_now (when);
  json_array_foreach (runs, i, run) {
    bool ok;
    if (!verify_selected (o, runs, i, run))
      continue;
    ok = verify_run (o, &d, manifest, run) == 0;
    checked++;
    /* Both results are recorded: a failed one makes the next backup a
     * full (it must not reference the damaged images), and list shows
     * it.
     */
    recorded = true;
    if (ok) {
      json_object_set_new (run, "verified", json_string (when));
      json_object_del (run, "verify_failed");
      if (!o->json)
        backup_info ("run %" PRIu64 ": verified (%s)", json_u64 (run, "seq"),
                     run_image (run));
    }
    else {
      json_object_set_new (run, "verify_failed", json_string (when));
      json_object_del (run, "verified");
      failed++;
    }
    json_array_append_new (out, json_pack ("{s:I, s:b}", "seq",
                                           (json_int_t) json_u64 (run, "seq"),
                                           "verified", ok));
  }
  if (recorded &&
      manifest_write (d.fd, dir_path, manifest, err, sizeof err) == -1)
    backup_error ("warning: the result is not recorded: %s", err);
  if (o->json)
    tool_json_result (json_pack ("{s:s, s:b, s:o}", "dir", dir_path,
                                 "ok", failed == 0 && checked > 0,
                                 "runs", out),
                      failed == 0 && checked > 0 ? EXIT_OK : EXIT_FAILED);
  else
    json_decref (out);
  json_decref (manifest);
  close (d.lock_fd);
  close (d.fd);
  return failed == 0 && checked > 0 ? EXIT_OK : EXIT_FAILED;
}

int
cmd_list (const struct backup_options *o, const char *dir_path)
{
  struct backup_dir d;
  json_t *manifest, *run, *out = json_array ();
  char err[1024];
  bool missing;
  size_t i;

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
  if (!o->json)
    printf ("%-5s %-12s %-20s %9s %14s %14s %-10s %-32s %s\n", "RUN", "TYPE",
            "STARTED", "DURATION", "BYTES_COPIED", "IMAGE_SIZE", "VERIFIED",
            "CHECKPOINT", "GROUP");
  json_array_foreach (json_object_get (manifest, "runs"), i, run) {
    bool empty = json_is_true (json_object_get (run, "empty"));
    const char *verified = json_str (run, "verified");
    uint64_t duration = json_u64 (run, "finished") - json_u64 (run, "started");
    struct stat st;
    json_int_t image_size = 0;

    if (!empty && run_image (run) &&
        fstatat (d.fd, run_image (run), &st, AT_SYMLINK_NOFOLLOW) == 0)
      image_size = st.st_size;
    if (o->json) {
      json_t *x = json_pack (
        "{s:I, s:s, s:s?, s:I, s:I, s:s?, s:I, s:b, s:s?, s:b, s:b, s:b,"
        " s:s?, s:s?}",
        "seq", (json_int_t) json_u64 (run, "seq"),
        "type", json_str (run, "type") ? json_str (run, "type") : "?",
        "started", json_str (run, "time"),
        "duration", (json_int_t) duration,
        "bytes_copied", (json_int_t) json_u64 (run, "bytes_copied"),
        "image", run_image (run),
        "image_size", image_size,
        "empty", empty,
        "checkpoint", json_str (run, "checkpoint"),
        "compressed", json_str (run, "compression") != NULL,
        "encrypted", json_is_true (json_object_get (run, "encrypted")),
        "verified", verified != NULL,
        "verified_at", verified,
        "verify_failed", json_str (run, "verify_failed"));
      /* The runs of other disks taken at the same instant share it. */
      if (x && json_str (run, "group")) {
        json_object_set (x, "group", json_object_get (run, "group"));
        if (json_object_get (run, "group_disks"))
          json_object_set (x, "group_disks",
                           json_object_get (run, "group_disks"));
        if (json_object_get (run, "held_ms"))
          json_object_set (x, "held_ms", json_object_get (run, "held_ms"));
      }
      json_array_append_new (out, x);
    }
    else
      printf ("%-5" PRIu64 " %-12s %-20s %8" PRIu64 "s %14" PRIu64
              " %14" PRId64 " %-10s %-32s %s\n", json_u64 (run, "seq"),
              empty ? "empty" : json_str (run, "type") ? json_str (run, "type")
              : "?", json_str (run, "time") ? json_str (run, "time") : "?",
              duration, json_u64 (run, "bytes_copied"), (int64_t) image_size,
              verified ? "yes" : json_str (run, "verify_failed") ? "FAILED"
              : "no",
              json_str (run, "checkpoint") ? json_str (run, "checkpoint")
              : "-", json_str (run, "group") ? json_str (run, "group") : "-");
  }
  if (o->json)
    tool_json_result (json_pack ("{s:s, s:s?, s:o}", "dir", dir_path,
                                 "chain_id", json_str (manifest, "chain_id"),
                                 "runs", out), EXIT_OK);
  else
    json_decref (out);
  json_decref (manifest);
  close (d.fd);
  return EXIT_OK;
}
