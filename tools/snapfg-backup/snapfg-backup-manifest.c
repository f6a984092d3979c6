/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the backup directory's files.
 *
 * DIR/manifest.json records every finished run (see snapfg-backup(1),
 * FILES).  It is only ever replaced whole: written to manifest.json.tmp,
 * fsync'd, renamed over the old one and the directory fsync'd, so a
 * crash leaves either the old or the new manifest, never a torn one.
 *
 * DIR/NNNN.sums holds the SHA-256 of every block of the disk as it was
 * at run NNNN's instant: a full run computes them all, an incremental
 * copies its predecessor's and replaces the blocks it copied.  Restore
 * checks what it wrote against them.  Layout (little endian):
 *
 *   "SFBSUMS1"  block size (u64)  disk size (u64)  block count (u64)
 *   then SHA256_LEN bytes per block, in disk order.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <unistd.h>
#include <sys/uio.h>
#include <sys/stat.h>

#include <gnutls/gnutls.h>
#include <gnutls/crypto.h>

#include "atomic-file.h"
#include "byte-order.h"
#include "cleanup.h"
#include "full-io.h"
#include "rounding.h"
#include "snapfg-backup.h"

#define MANIFEST "manifest.json"
#define SUMS_MAGIC "SFBSUMS1"

int
fsync_dir (int dirfd)
{
  return fsync (dirfd);
}

int
fsync_file (int dirfd, const char *name)
{
  int fd = openat (dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  int r, saved_errno;

  if (fd == -1)
    return -1;
  r = fsync (fd);
  saved_errno = errno;
  close (fd);
  errno = saved_errno;
  return r;
}

unsigned char *
sums_new_zero (uint64_t block, uint64_t size)
{
  uint64_t nb = div_round_up (size, block);
  unsigned char z[SHA256_LEN], zl[SHA256_LEN];
  unsigned char *sums = malloc (nb * SHA256_LEN + 1);

  if (sums == NULL)
    return NULL;
  sha256_zero (block, z);
  sha256_zero (size - (nb - 1) * block, zl);
  for (uint64_t b = 0; b < nb; ++b)
    memcpy (sums + b * SHA256_LEN, b == nb - 1 ? zl : z, SHA256_LEN);
  return sums;
}

/* Replace dir/name whole (see atomic-file.h).  The directory is locked
 * by this run, so a NAME.tmp left by a crash is ours to replace.
 */
static int
write_atomically (int dirfd, const char *dir, const char *name,
                  const void *head, size_t head_len,
                  const void *body, size_t body_len,
                  char *err, size_t err_len)
{
  struct iovec iov[2] = {
    { .iov_base = (void *) head, .iov_len = head_len },
    { .iov_base = (void *) body, .iov_len = body_len },
  };
  const char *step = "write";

  if (atomic_file_write (dirfd, name, 0600, ATOMIC_FILE_REPLACE_LEFTOVER,
                         iov, 2, &step) < 0) {
    snprintf (err, err_len, "cannot %s %s/%s.tmp: %s", step, dir, name,
              strerror (errno));
    return -1;
  }
  return 0;
}

json_t *
manifest_read (int dirfd, const char *dir, bool *missing,
               char *err, size_t err_len)
{
  json_error_t jerr;
  json_t *m;
  FILE *fp;
  int fd;

  *missing = false;
  fd = openat (dirfd, MANIFEST, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd == -1) {
    if (errno == ENOENT) {
      *missing = true;
      return NULL;
    }
    snprintf (err, err_len, "%s/%s: %s", dir, MANIFEST, strerror (errno));
    return NULL;
  }
  fp = fdopen (fd, "r");
  if (fp == NULL) {
    close (fd);
    snprintf (err, err_len, "%s/%s: %s", dir, MANIFEST, strerror (errno));
    return NULL;
  }
  m = json_loadf (fp, 0, &jerr);
  fclose (fp);
  if (m == NULL) {
    snprintf (err, err_len, "%s/%s: not valid JSON (line %d: %s)", dir,
              MANIFEST, jerr.line, jerr.text);
    return NULL;
  }
  if (!json_is_object (m) ||
      !json_is_string (json_object_get (m, "format")) ||
      strcmp (json_string_value (json_object_get (m, "format")),
              "snapfg-backup-manifest") != 0 ||
      json_integer_value (json_object_get (m, "version")) != 1 ||
      !json_is_array (json_object_get (m, "runs")) ||
      !json_is_string (json_object_get (m, "chain_id"))) {
    snprintf (err, err_len, "%s/%s: not a snapfg-backup manifest (version 1)",
              dir, MANIFEST);
    json_decref (m);
    return NULL;
  }
  return m;
}

int
manifest_write (int dirfd, const char *dir, json_t *manifest,
                char *err, size_t err_len)
{
  char *text = json_dumps (manifest, JSON_INDENT (2) | JSON_PRESERVE_ORDER);
  int r;

  if (text == NULL) {
    snprintf (err, err_len, "out of memory writing the manifest");
    return -1;
  }
  r = write_atomically (dirfd, dir, MANIFEST, text, strlen (text), "\n", 1,
                        err, err_len);
  free (text);
  return r;
}

static uint64_t
block_count (uint64_t block, uint64_t size)
{
  return div_round_up (size, block);
}

int
sums_write (int dirfd, const char *name, uint64_t block, uint64_t size,
            const unsigned char *sums, char *err, size_t err_len)
{
  unsigned char head[32];

  memcpy (head, SUMS_MAGIC, 8);
  put_le64 (head + 8, block);
  put_le64 (head + 16, size);
  put_le64 (head + 24, block_count (block, size));
  return write_atomically (dirfd, ".", name, head, sizeof head, sums,
                           block_count (block, size) * SHA256_LEN,
                           err, err_len);
}

unsigned char *
sums_read (int dirfd, const char *name, uint64_t block, uint64_t size,
           char *err, size_t err_len)
{
  unsigned char head[32];
  uint64_t n = block_count (block, size), v[3];
  CLEANUP_FREE unsigned char *sums = NULL;
  CLEANUP_CLOSE int fd = -1;
  struct stat st;

  fd = openat (dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd == -1) {
    snprintf (err, err_len, "%s: %s", name, strerror (errno));
    return NULL;
  }
  if (fstat (fd, &st) == -1 || full_read (fd, head, sizeof head) < 0 ||
      memcmp (head, SUMS_MAGIC, 8) != 0) {
    snprintf (err, err_len, "%s: not a snapfg-backup sums file", name);
    return NULL;
  }
  for (int i = 0; i < 3; ++i)
    v[i] = get_le64 (head + 8 + 8 * i);
  if (v[0] != block || v[1] != size || v[2] != n || (uint64_t) st.st_size != 32 + n * SHA256_LEN) {
    snprintf (err, err_len, "%s: made for another disk size or block "
              "(block %" PRIu64 ", size %" PRIu64 "; expected %" PRIu64
              " and %" PRIu64 ")", name, v[0], v[1],
              block, size);
    return NULL;
  }
  sums = malloc (n * SHA256_LEN + 1);
  if (sums == NULL || full_read (fd, sums, n * SHA256_LEN) < 0) {
    snprintf (err, err_len, "%s: %s", name,
              sums ? "short read" : "out of memory");
    return NULL;
  }
  return TAKE_PTR (sums);
}

void
sums_digest (const unsigned char *sums, uint64_t block,
             const struct copy_range *ranges, size_t nranges, uint64_t size,
             unsigned char out[SHA256_LEN])
{
  gnutls_hash_hd_t h;

  if (gnutls_hash_init (&h, GNUTLS_DIG_SHA256) < 0)
    abort ();
  if (ranges == NULL)
    gnutls_hash (h, sums, block_count (block, size) * SHA256_LEN);
  else
    for (size_t i = 0; i < nranges; ++i) {
      uint64_t first = ranges[i].offset / block;
      uint64_t end = ranges[i].offset + ranges[i].length;
      if (end > size)
        end = size;
      if (end > ranges[i].offset)
        gnutls_hash (h, sums + first * SHA256_LEN,
                     (block_count (block, end) - first) * SHA256_LEN);
    }
  gnutls_hash_deinit (h, out);
}

json_t *
manifest_run (json_t *manifest, uint64_t seq)
{
  json_t *v;
  size_t i;

  json_array_foreach (json_object_get (manifest, "runs"), i, v)
    if (json_u64 (v, "seq") == seq)
      return v;
  return NULL;
}

unsigned char *
run_sums (int dirfd, const char *dir, json_t *run, char *err, size_t err_len)
{
  const char *name = json_str (run, "sums");
  const char *want = json_str (run, "disk_sha256");
  uint64_t seq = json_u64 (run, "seq");
  unsigned char *sums, digest[SHA256_LEN];
  char why[512], hex[65];

  if (name == NULL || want == NULL) {
    snprintf (err, err_len, "run %" PRIu64 " in %s/%s records no %s: it "
              "cannot be verified", seq, dir, MANIFEST,
              name == NULL ? "block sums file (\"sums\")" : "disk_sha256");
    return NULL;
  }
  sums = sums_read (dirfd, name, json_u64 (run, "sum_block"),
                    json_u64 (run, "size"), why, sizeof why);
  if (sums == NULL) {
    snprintf (err, err_len, "run %" PRIu64 " cannot be verified: %s/%s",
              seq, dir, why);
    return NULL;
  }
  sums_digest (sums, json_u64 (run, "sum_block"), NULL, 0,
               json_u64 (run, "size"), digest);
  hex_digest (digest, hex);
  if (strcmp (hex, want) != 0) {
    snprintf (err, err_len, "%s/%s does not match run %" PRIu64 "'s "
              "disk_sha256 in the manifest: the backup directory is damaged",
              dir, name, seq);
    free (sums);
    return NULL;
  }
  return sums;
}
