/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the restore command.
 *
 * Writes the disk as it was at one run to a new file, or to standard
 * output with OUT "-".  The run's chain is checked against the manifest
 * first (chain_check), then read through qemu-nbd and copied by the copy
 * engine, which checksums every block it reads: the copy is compared
 * with the run's block sums, the new file is read back and compared
 * again, and only then renamed into place.  A run that cannot be
 * verified (its sums file missing or damaged, or not recorded) is not
 * restored unless --no-verify says so.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>
#include <sys/stat.h>

#include "full-io.h"
#include "rounding.h"
#include "snapfg-backup.h"

/* What one restore has open. */
struct restore {
  const struct backup_options *o;
  const char *dir_path;
  struct backup_dir d;
  json_t *manifest;
  json_t *run;
  uint64_t seq, size, block;
  unsigned char *expected;      /* the run's sums; NULL: --no-verify */
  struct image_access access;
  struct nbd_handle *src;       /* the run's chain, through qemu-nbd */
  int fail_status;              /* the exit status if it fails */
};

/* The run asked for (--at N, or the latest). */
static json_t *
find_run (struct restore *r)
{
  json_t *runs = json_object_get (r->manifest, "runs");
  size_t n = json_array_size (runs);
  json_t *run;

  run = r->o->at < 0 ? json_array_get (runs, n - 1)
                     : manifest_run (r->manifest, r->o->at);
  if (run == NULL) {
    if (n == 0)
      backup_error ("%s: the manifest records no run yet", r->dir_path);
    else
      backup_error ("%s: no run %ld (runs %" PRIu64 " to %" PRIu64 ")",
                    r->dir_path, r->o->at,
                    json_u64 (json_array_get (runs, 0), "seq"),
                    json_u64 (json_array_get (runs, n - 1), "seq"));
  }
  else if (json_is_true (json_object_get (run, "pruning")))
    backup_error ("%s: run %" PRIu64 " is being pruned (an interrupted "
                  "prune): it cannot be restored; run prune again",
                  r->dir_path, json_u64 (run, "seq"));
  else
    return run;
  return NULL;
}

/* 1. The directory, the run, its sums and its chain, opened. */
static int
restore_open (struct restore *r)
{
  char err[1024], **chain = NULL;
  bool missing;
  int depth;

  if (open_backup_dir (r->dir_path, false, &r->d) == -1)
    return -1;
  r->manifest = manifest_read (r->d.fd, r->dir_path, &missing,
                               err, sizeof err);
  if (r->manifest == NULL) {
    if (missing)
      backup_error ("%s: no manifest.json: not a snapfg-backup directory",
                    r->dir_path);
    else
      backup_error ("%s", err);
    return -1;
  }
  r->run = find_run (r);
  if (r->run == NULL)
    return -1;
  if (key_status (r->o, r->run) != EXIT_OK) {
    r->fail_status = EXIT_USAGE;
    return -1;
  }
  r->seq = json_u64 (r->run, "seq");
  r->size = json_u64 (r->run, "size");
  r->block = json_u64 (r->run, "sum_block");

  r->expected = run_sums (r->d.fd, r->dir_path, r->run, err, sizeof err);
  if (r->expected == NULL) {
    if (!r->o->no_verify) {
      backup_error ("%s; restore writes only a disk it can verify "
                    "(--no-verify restores it unverified)", err);
      return -1;
    }
    backup_info ("warning: --no-verify: %s", err);
  }
  if (run_access (r->o, r->run, &r->access) == -1)
    return -1;
  depth = chain_check (r->d.fd, r->dir_path, r->manifest, r->run, &chain);
  if (depth < 0)
    return -1;
  r->src = image_open (r->dir_path, chain[0], depth, &r->access, true);
  chain_free (chain);
  if (r->src == NULL)
    return -1;
  if ((uint64_t) nbd_get_size (r->src) != r->size) {
    backup_error ("run %" PRIu64 ": qemu-nbd serves %" PRId64 " bytes, "
                  "the manifest says %" PRIu64, r->seq,
                  nbd_get_size (r->src), r->size);
    return -1;
  }
  return 0;
}

/* 2a. To standard output: read in order, check each block as it goes.
 * What was written before a mismatch cannot be taken back: the exit
 * status says the stream is wrong.
 */
static int
restore_to_stdout (struct restore *r)
{
  uint64_t chunk = r->block > (1 << 20) ? r->block : (1 << 20);
  double t0 = tool_now ();
  char *buf;
  int status = -1;

  if (isatty (1)) {
    backup_error ("restore %s -: standard output is a terminal; redirect "
                  "it to a file or a pipe", r->dir_path);
    return -1;
  }
  buf = malloc (chunk);
  if (buf == NULL) {
    backup_error ("out of memory");
    return -1;
  }
  for (uint64_t off = 0; off < r->size; off += chunk) {
    uint64_t len = r->size - off < chunk ? r->size - off : chunk;
    if (nbd_pread (r->src, buf, len, off, 0) == -1) {
      backup_error ("reading run %" PRIu64 " at offset %" PRIu64 ": %s",
                    r->seq, off, nbd_get_error ());
      goto out;
    }
    for (uint64_t b = 0; r->expected && b < len; b += r->block) {
      unsigned char sum[SHA256_LEN];
      uint64_t bl = len - b < r->block ? len - b : r->block;
      sha256_buf (buf + b, bl, sum);
      if (memcmp (sum, r->expected + (off + b) / r->block * SHA256_LEN,
                  SHA256_LEN) != 0) {
        backup_error ("the restored disk differs from run %" PRIu64 " at "
                      "offset %" PRIu64 " (block of %" PRIu64 " bytes): the "
                      "backup chain is damaged; the output is wrong",
                      r->seq, off + b, r->block);
        goto out;
      }
    }
    if (full_write (1, buf, len) < 0) {
      backup_error ("writing to standard output: %m");
      goto out;
    }
    /* --limit-rate: no faster than the rate, on average from the start. */
    if (r->o->limit_rate) {
      double ahead = (double) (off + len) / r->o->limit_rate
        - (tool_now () - t0);
      if (ahead > 0)
        usleep ((useconds_t) (ahead * 1e6));
    }
  }
  status = 0;
 out:
  free (buf);
  return status;
}

/* 2b. To a new file: copy, compare, read back, compare, rename. */
static int
restore_to_file (struct restore *r, const char *out)
{
  char tmp[PATH_MAX], err[1024];
  struct nbd_handle *dst = NULL, *h = NULL;
  struct copy_range *ranges = NULL;
  unsigned char *got = NULL;
  struct copy_job job;
  size_t nranges;
  struct stat st;
  int fd = -1, status = -1;

  /* A new file, or an empty one (mktemp's): nothing is lost. */
  if (lstat (out, &st) == 0 && !(S_ISREG (st.st_mode) && st.st_size == 0)) {
    backup_error ("%s exists and is not an empty file: restore writes a "
                  "new file; remove it or give another name", out);
    return -1;
  }
  snprintf (tmp, sizeof tmp, "%s.tmp%d", out, (int) getpid ());
  dst = output_open (tmp, r->o->format, r->size, &fd);
  if (dst == NULL)
    goto out;
  test_pause ("restore-copy");
  got = sums_new_zero (r->block, r->size);
  if (got == NULL || data_ranges (r->src, r->size, r->block, &ranges,
                                  &nranges) == -1) {
    backup_error ("out of memory");
    goto out;
  }
  memset (&job, 0, sizeof job);
  job.src = &r->src;
  job.nsrc = 1;
  job.dst = dst;
  job.ranges = ranges;
  job.nranges = nranges;
  job.size = r->size;
  job.block = r->block;
  job.sums = got;
  job.what = "restore";
  job.rate = r->o->limit_rate;
  if (copy_run (&job, err, sizeof err) == -1) {
    backup_error ("restoring run %" PRIu64 " to %s: %s", r->seq, out, err);
    goto out;
  }
  if (nbd_flush (dst, 0) == -1) {
    backup_error ("%s: flush: %s", tmp, nbd_get_error ());
    goto out;
  }
  disconnect (dst);
  dst = NULL;
  if (r->expected) {
    /* What the chain gave, then what reached the file. */
    if (sums_compare (got, r->expected, r->run, "the restored disk") == -1)
      goto out;
    h = open_image (tmp, r->o->format, true);
    if (h == NULL || verify_disk (h, r->run, r->expected, "verify",
                                  "the restored disk") == -1)
      goto out;
  }
  if (fsync (fd) == -1) {
    backup_error ("%s: fsync: %m", tmp);
    goto out;
  }
  if (rename (tmp, out) == -1) {
    backup_error ("rename %s to %s: %m", tmp, out);
    goto out;
  }
  status = 0;
 out:
  disconnect (dst);
  disconnect (h);
  if (status != 0 && fd >= 0)
    unlink (tmp);
  if (fd >= 0)
    close (fd);
  free (ranges);
  free (got);
  return status;
}

int
cmd_restore (const struct backup_options *o, const char *dir_path,
             const char *out)
{
  struct restore r = { .o = o, .dir_path = dir_path, .d = { .fd = -1 },
                       .fail_status = EXIT_FAILED };
  int status;

  if (restore_open (&r) == 0 &&
      (strcmp (out, "-") == 0 ? restore_to_stdout (&r)
                              : restore_to_file (&r, out)) == 0) {
    backup_info ("restored run %" PRIu64 " (%s) to %s%s", r.seq,
                 json_str (r.run, "time"),
                 strcmp (out, "-") == 0 ? "standard output" : out,
                 r.expected ? ", verified" : ", NOT verified (--no-verify)");
    status = EXIT_OK;
  }
  else
    status = r.fail_status;
  disconnect (r.src);
  free (r.expected);
  json_decref (r.manifest);
  if (r.d.fd >= 0)
    close (r.d.fd);
  return status;
}
