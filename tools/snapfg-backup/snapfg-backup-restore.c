/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the restore command.
 *
 * Writes the disk as it was at one run to a new file (qemu-img convert
 * of that run's image, which reads through its backing chain), then
 * reads it back and checks every block against the run's block sums
 * before renaming it into place.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>
#include <sys/stat.h>

#include "rounding.h"
#include "snapfg-backup.h"

int
cmd_restore (const struct backup_options *o, const char *dir_path, const char *out)
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

    h = open_image (tmp, o->format, true);
    if (h == NULL)
      goto fail;
    if ((uint64_t) nbd_get_size (h) != size) {
      backup_error ("%s: %" PRId64 " bytes, the backup %" PRIu64, tmp,
                    nbd_get_size (h), size);
      goto fail;
    }
    got = sums_new_zero (block, size);
    if (got == NULL)
      goto fail;
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
  if (fsync_file (AT_FDCWD, tmp) == -1) {
    backup_error ("%s: fsync: %m", tmp);
    goto fail;
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
