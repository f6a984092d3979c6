/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: a persistent dirty bitmap of the origin (see cbt-bitmap.h). */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "byte-order.h"
#include "cbt-bitmap.h"
#include "file-create.h"
#include "full-io.h"
#include "rounding.h"
#include "snapfg-log.h"

/* Words written by one pwrite of the slow path (4 KiB). */
#define WORDS_PER_WRITE 512

/* Test hook: SNAPFG_TEST_CBT_WRITE_ERROR=N makes the Nth write of bits
 * (counted over all bitmaps) fail with EIO, as a failing disk would.
 */
static atomic_long write_error_countdown;
static pthread_once_t write_error_once = PTHREAD_ONCE_INIT;

static void
read_write_error_hook (void)
{
  const char *env = getenv ("SNAPFG_TEST_CBT_WRITE_ERROR");

  atomic_store (&write_error_countdown, env && *env ? atol (env) : 0);
}

static bool
test_write_error (void)
{
  pthread_once (&write_error_once, read_write_error_hook);
  return atomic_load (&write_error_countdown) > 0 &&
    atomic_fetch_sub (&write_error_countdown, 1) == 1;
}

const char *
cbt_check_granularity (int64_t granularity, int64_t chunk_size)
{
  if (granularity <= 0 || !is_power_of_two (granularity))
    return "must be a power of two";
  if (granularity < chunk_size)
    return "must be at least chunk-size= (the copy-out unit)";
  if (granularity > CBT_MAX_GRANULARITY)
    return "must be at most 1G";
  return NULL;
}

void
cbt_boot_id (char id[CBT_BOOT_ID_LEN])
{
  const char *env = getenv ("SNAPFG_TEST_BOOT_ID");
  FILE *fp;

  memset (id, 0, CBT_BOOT_ID_LEN);
  if (env && *env) {
    snprintf (id, CBT_BOOT_ID_LEN, "%s", env);
    return;
  }
  fp = fopen ("/proc/sys/kernel/random/boot_id", "re");
  if (fp == NULL || fgets (id, CBT_BOOT_ID_LEN, fp) == NULL) {
    /* No boot id: every open after a crash will call the bitmap
     * inconsistent, which is safe.
     */
    snprintf (id, CBT_BOOT_ID_LEN, "unknown-%ld", (long) getpid ());
  }
  if (fp)
    fclose (fp);
  id[strcspn (id, "\n")] = '\0';
}

/* --- the header --- */

/* Offsets in the header (little endian; the rest of it is zero). */
#define HDR_MAGIC 0                    /* CBT_MAGIC, 8 bytes */
#define HDR_VERSION 8                  /* le32 */
#define HDR_HEADER_SIZE 12             /* le32 */
#define HDR_GRANULARITY 16             /* le32 */
#define HDR_FLAGS 20                   /* le32 */
#define HDR_ORIGIN_SIZE 24             /* le64 */
#define HDR_GRANULES 32                /* le64 */
#define HDR_BOOT_ID 40                 /* CBT_BOOT_ID_LEN bytes */
#define HDR_CREATED (HDR_BOOT_ID + CBT_BOOT_ID_LEN) /* le64 */

static void
encode_header (const struct cbt_bitmap *bm, uint32_t flags,
               unsigned char buf[CBT_HEADER_SIZE])
{
  memset (buf, 0, CBT_HEADER_SIZE);
  memcpy (buf + HDR_MAGIC, CBT_MAGIC, 8);
  put_le32 (buf + HDR_VERSION, CBT_VERSION);
  put_le32 (buf + HDR_HEADER_SIZE, CBT_HEADER_SIZE);
  put_le32 (buf + HDR_GRANULARITY, bm->granularity);
  put_le32 (buf + HDR_FLAGS, flags);
  put_le64 (buf + HDR_ORIGIN_SIZE, bm->origin_size);
  put_le64 (buf + HDR_GRANULES, bm->granules);
  memcpy (buf + HDR_BOOT_ID, bm->boot_id, CBT_BOOT_ID_LEN);
  put_le64 (buf + HDR_CREATED, bm->created);
}

/* Write the header with these flags and sync it (the caller holds
 * bm->lock or is alone with the bitmap).
 */
static int
write_header (struct cbt_bitmap *bm, uint32_t flags)
{
  unsigned char buf[CBT_HEADER_SIZE];
  int r;

  if (bm->fd < 0)
    return 0;
  encode_header (bm, flags, buf);
  r = full_pwrite (bm->fd, buf, sizeof buf, 0);
  if (r == 0 && fdatasync (bm->fd) == -1)
    r = -errno;
  return r;
}

static struct cbt_bitmap *
bitmap_alloc (const char *path, uint32_t granularity, uint64_t origin_size)
{
  struct cbt_bitmap *bm = calloc (1, sizeof *bm);

  if (bm == NULL)
    return NULL;
  bm->fd = -1;
  bm->granularity = granularity;
  bm->shift = log2_of_power_of_two (granularity);
  bm->origin_size = origin_size;
  bm->granules = div_round_up (origin_size, granularity);
  bm->nwords = (bm->granules + 63) / 64;
  bm->words = calloc (bm->nwords ? bm->nwords : 1, sizeof *bm->words);
  bm->path = strdup (path ? path : "(memory)");
  if (bm->words == NULL || bm->path == NULL) {
    free (bm->words);
    free (bm->path);
    free (bm);
    return NULL;
  }
  pthread_mutex_init (&bm->lock, NULL);
  atomic_init (&bm->inconsistent, false);
  atomic_init (&bm->written_gen, 0);
  atomic_init (&bm->synced_gen, 0);
  cbt_boot_id (bm->boot_id);
  return bm;
}

static void
bitmap_free (struct cbt_bitmap *bm)
{
  if (bm->fd >= 0)
    close (bm->fd);
  pthread_mutex_destroy (&bm->lock);
  free ((void *) bm->words);
  free (bm->path);
  free (bm);
}

int
cbt_bitmap_create (const char *path, uint32_t granularity,
                   uint64_t origin_size, struct cbt_bitmap **bmp)
{
  struct cbt_bitmap *bm = bitmap_alloc (path, granularity, origin_size);
  int r;

  if (bm == NULL)
    return -ENOMEM;
  bm->created = time (NULL);
  bm->fd = open (path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (bm->fd == -1) {
    r = -errno;
    if (r == -EEXIST)
      snapfg_error ("checkpoint bitmap %s: already exists; refusing to "
                    "replace a file this server did not create (remove it "
                    "if it is a leftover)", path);
    else
      snapfg_error ("checkpoint bitmap %s: cannot create: %s", path,
                    strerror (-r));
    bitmap_free (bm);
    return r;
  }
  /* The bits are zero: a sparse file of the right length holds them. */
  /* Allocated, not sparse: a first write to a granule must not fail
   * for want of space (that would make the bitmap inconsistent).
   */
  if (ftruncate (bm->fd, CBT_HEADER_SIZE + bm->nwords * 8) == -1)
    r = -errno;
  else {
    r = -posix_fallocate (bm->fd, 0, CBT_HEADER_SIZE + bm->nwords * 8);
    if (r == -EOPNOTSUPP || r == -EINVAL)
      r = 0;                    /* the file system cannot: sparse it is */
  }
  if (r == 0)
    r = write_header (bm, CBT_FLAG_DIRTY);
  if (r == 0 && fsync (bm->fd) == -1)
    r = -errno;
  if (r == 0)
    r = sync_directory_of (path);
  if (r < 0) {
    snapfg_error ("checkpoint bitmap %s: cannot write: %s", path,
                  strerror (-r));
    bitmap_free (bm);
    unlink (path);
    return r;
  }
  *bmp = bm;
  return 0;
}

int
cbt_bitmap_open (const char *path, uint64_t origin_size,
                 struct cbt_bitmap **bmp, char *why, size_t why_len)
{
  unsigned char buf[CBT_HEADER_SIZE];
  struct cbt_bitmap *bm;
  uint32_t granularity, flags;
  uint64_t *raw;
  struct stat st;
  char boot_id[CBT_BOOT_ID_LEN];
  int fd, r;

  why[0] = '\0';
  fd = open (path, O_RDWR | O_CLOEXEC);
  if (fd == -1) {
    r = -errno;
    snprintf (why, why_len, "cannot open: %s", strerror (-r));
    return r;
  }
  if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode)) {
    snprintf (why, why_len, "not a regular file");
    close (fd);
    return -EINVAL;
  }
  r = full_pread (fd, buf, sizeof buf, 0);
  if (r < 0) {
    snprintf (why, why_len, r == -ENODATA ? "too short for a checkpoint "
              "bitmap header" : "cannot read: %s", strerror (-r));
    close (fd);
    return r == -ENODATA ? -EINVAL : r;
  }
  if (memcmp (buf + HDR_MAGIC, CBT_MAGIC, 8) != 0) {
    snprintf (why, why_len, "not a snapfg checkpoint bitmap (no %s magic)",
              CBT_MAGIC);
    close (fd);
    return -EINVAL;
  }
  if (get_le32 (buf + HDR_VERSION) != CBT_VERSION ||
      get_le32 (buf + HDR_HEADER_SIZE) != CBT_HEADER_SIZE) {
    snprintf (why, why_len, "unsupported checkpoint bitmap version %" PRIu32
              " (this snapfg reads version %d)", get_le32 (buf + HDR_VERSION),
              CBT_VERSION);
    close (fd);
    return -EINVAL;
  }
  granularity = get_le32 (buf + HDR_GRANULARITY);
  if (granularity < 512 || granularity > CBT_MAX_GRANULARITY ||
      !is_power_of_two (granularity)) {
    snprintf (why, why_len, "corrupt header: granularity %" PRIu32,
              granularity);
    close (fd);
    return -EINVAL;
  }
  if (get_le64 (buf + HDR_ORIGIN_SIZE) != origin_size) {
    snprintf (why, why_len, "made for an origin of %" PRIu64 " bytes, but "
              "the origin has %" PRIu64 " bytes",
              get_le64 (buf + HDR_ORIGIN_SIZE),
              origin_size);
    close (fd);
    return -EINVAL;
  }
  bm = bitmap_alloc (path, granularity, origin_size);
  if (bm == NULL) {
    close (fd);
    return -ENOMEM;
  }
  bm->fd = fd;
  bm->created = get_le64 (buf + HDR_CREATED);
  if (get_le64 (buf + HDR_GRANULES) != bm->granules ||
      (uint64_t) st.st_size < CBT_HEADER_SIZE + bm->nwords * 8) {
    snprintf (why, why_len, "corrupt header or truncated file (%" PRIu64
              " granules, %" PRIu64 " bytes)", get_le64 (buf + HDR_GRANULES),
              (uint64_t) st.st_size);
    bitmap_free (bm);
    return -EINVAL;
  }
  raw = malloc (bm->nwords * 8 + 8);
  if (raw == NULL) {
    bitmap_free (bm);
    return -ENOMEM;
  }
  r = full_pread (fd, raw, bm->nwords * 8, CBT_HEADER_SIZE);
  if (r < 0) {
    snprintf (why, why_len, "cannot read the bits: %s", strerror (-r));
    free (raw);
    bitmap_free (bm);
    return r;
  }
  for (uint64_t w = 0; w < bm->nwords; ++w)
    atomic_init (&bm->words[w], get_le64 (&raw[w]));
  free (raw);

  flags = get_le32 (buf + HDR_FLAGS);
  memcpy (boot_id, buf + HDR_BOOT_ID, CBT_BOOT_ID_LEN);
  boot_id[CBT_BOOT_ID_LEN - 1] = '\0';
  if (flags & CBT_FLAG_INCONSISTENT) {
    snprintf (why, why_len, "flagged inconsistent (a bitmap write failed "
              "or the system stopped uncleanly earlier)");
    atomic_store (&bm->inconsistent, true);
  }
  else if ((flags & CBT_FLAG_DIRTY) && strcmp (boot_id, bm->boot_id) != 0) {
    snprintf (why, why_len, "in use when the system stopped uncleanly "
              "(boot id %s, now %s): changes still in the page cache may "
              "be lost", boot_id, bm->boot_id);
    atomic_store (&bm->inconsistent, true);
    /* Say so in the file too, whatever happens next. */
    write_header (bm, flags | CBT_FLAG_INCONSISTENT);
  }
  *bmp = bm;
  return 0;
}

static uint32_t
current_flags (const struct cbt_bitmap *bm, bool dirty)
{
  return (dirty ? CBT_FLAG_DIRTY : 0) |
    (atomic_load (&bm->inconsistent) ? CBT_FLAG_INCONSISTENT : 0);
}

int
cbt_bitmap_set_dirty (struct cbt_bitmap *bm)
{
  int r;

  pthread_mutex_lock (&bm->lock);
  cbt_boot_id (bm->boot_id);
  r = write_header (bm, current_flags (bm, true));
  pthread_mutex_unlock (&bm->lock);
  if (r < 0)
    cbt_bitmap_set_inconsistent (bm, "cannot mark the bitmap in use", -r);
  return r;
}

int
cbt_bitmap_sync (struct cbt_bitmap *bm)
{
  uint64_t gen = atomic_load (&bm->written_gen);
  int r = 0;

  if (bm->fd < 0 || gen == atomic_load (&bm->synced_gen))
    return 0;
  if (fdatasync (bm->fd) == -1) {
    r = -errno;
    cbt_bitmap_set_inconsistent (bm, "syncing the bitmap failed", -r);
    return r;
  }
  /* Only move forward (another flush may have synced a later gen). */
  for (uint64_t old = atomic_load (&bm->synced_gen); old < gen; )
    if (atomic_compare_exchange_weak (&bm->synced_gen, &old, gen))
      break;
  return 0;
}

int
cbt_bitmap_set_clean (struct cbt_bitmap *bm)
{
  int r;

  if (bm->fd < 0)
    return 0;
  pthread_mutex_lock (&bm->lock);
  r = fdatasync (bm->fd) == -1 ? -errno : 0;
  if (r == 0)
    r = write_header (bm, current_flags (bm, false));
  pthread_mutex_unlock (&bm->lock);
  if (r < 0)
    cbt_bitmap_set_inconsistent (bm, "cannot close the bitmap cleanly", -r);
  return r;
}

void
cbt_bitmap_set_inconsistent (struct cbt_bitmap *bm, const char *why,
                             int err)
{
  if (atomic_exchange (&bm->inconsistent, true))
    return;                     /* said so already */
  snapfg_error ("checkpoint bitmap %s is now inconsistent: %s%s%s (an "
                "incremental backup from this checkpoint needs a full "
                "backup first)", bm->path, why, err ? ": " : "",
                err ? strerror (err) : "");
  pthread_mutex_lock (&bm->lock);
  /* Best effort: the owner records it elsewhere too. */
  write_header (bm, CBT_FLAG_DIRTY | CBT_FLAG_INCONSISTENT);
  pthread_mutex_unlock (&bm->lock);
  if (bm->on_inconsistent)
    bm->on_inconsistent (bm, bm->opaque);
}

struct cbt_bitmap *
cbt_bitmap_new_memory (uint32_t granularity, uint64_t origin_size)
{
  return bitmap_alloc (NULL, granularity, origin_size);
}

void
cbt_bitmap_close (struct cbt_bitmap *bm)
{
  if (bm)
    bitmap_free (bm);
}

/* Set granules [first, last] that are not set yet: write the new words
 * to the file, then publish them.  bm->lock serialises first writes, so
 * the file always receives the newest value of a word and a word is
 * published only after the file has it.
 */
void
cbt_bitmap_mark_slow (struct cbt_bitmap *bm, uint64_t first, uint64_t last)
{
  uint64_t buf[WORDS_PER_WRITE];
  uint64_t fw = first >> 6, lw = last >> 6;
  int r = 0;

  pthread_mutex_lock (&bm->lock);
  for (uint64_t w0 = fw; w0 <= lw && r == 0; w0 += WORDS_PER_WRITE) {
    uint64_t n = lw - w0 + 1 < WORDS_PER_WRITE ? lw - w0 + 1
      : WORDS_PER_WRITE;
    bool changed = false;

    for (uint64_t i = 0; i < n; ++i) {
      uint64_t w = w0 + i;
      uint64_t lo = w == fw ? (first & 63) : 0;
      uint64_t hi = w == lw ? (last & 63) : 63;
      uint64_t mask = (hi == 63 ? ~UINT64_C (0)
                       : (UINT64_C (1) << (hi + 1)) - 1)
        & ~((UINT64_C (1) << lo) - 1);
      uint64_t old = atomic_load_explicit (&bm->words[w],
                                           memory_order_relaxed);

      buf[i] = old | mask;
      changed |= buf[i] != old;
    }
    if (!changed)
      continue;
    if (bm->fd >= 0) {
      uint64_t le[WORDS_PER_WRITE];

      for (uint64_t i = 0; i < n; ++i)
        put_le64 (&le[i], buf[i]);
      r = test_write_error () ? -EIO
        : full_pwrite (bm->fd, le, n * 8, CBT_HEADER_SIZE + w0 * 8);
      if (r < 0)
        break;
      atomic_fetch_add (&bm->written_gen, 1);
    }
    for (uint64_t i = 0; i < n; ++i)
      atomic_store_explicit (&bm->words[w0 + i], buf[i],
                             memory_order_release);
  }
  pthread_mutex_unlock (&bm->lock);
  if (r < 0)
    cbt_bitmap_set_inconsistent (bm, "writing the bitmap failed", -r);
}

uint64_t
cbt_bitmap_count (const struct cbt_bitmap *bm)
{
  uint64_t n = 0;

  for (uint64_t w = 0; w < bm->nwords; ++w)
    n += __builtin_popcountll (atomic_load (&((struct cbt_bitmap *) bm)->words[w]));
  return n;
}

int
cbt_bitmap_or (struct cbt_bitmap *dst, const struct cbt_bitmap *src)
{
  uint64_t *raw;
  int r = 0;

  raw = malloc (dst->nwords * 8 + 8);
  if (raw == NULL)
    return -ENOMEM;
  pthread_mutex_lock (&dst->lock);
  for (uint64_t w = 0; w < dst->nwords; ++w)
    raw[w] = atomic_load (&dst->words[w]);
  if (src->granularity == dst->granularity)
    for (uint64_t w = 0; w < dst->nwords; ++w)
      raw[w] |= atomic_load (&((struct cbt_bitmap *) src)->words[w]);
  else {
    /* Granularity changed between runs: set every dst granule that
     * overlaps a set src granule.
     */
    for (uint64_t g = 0; g < src->granules; ++g) {
      uint64_t start, end;

      if (!cbt_bitmap_test (src, g))
        continue;
      start = g << src->shift;
      end = start + src->granularity;
      if (end > dst->origin_size)
        end = dst->origin_size;
      for (uint64_t d = start >> dst->shift; d <= (end - 1) >> dst->shift;
           ++d)
        raw[d >> 6] |= UINT64_C (1) << (d & 63);
    }
  }
  if (dst->fd >= 0) {
    uint64_t *le = malloc (dst->nwords * 8 + 8);

    if (le == NULL)
      r = -ENOMEM;
    else {
      for (uint64_t w = 0; w < dst->nwords; ++w)
        put_le64 (&le[w], raw[w]);
      r = full_pwrite (dst->fd, le, dst->nwords * 8, CBT_HEADER_SIZE);
      if (r == 0 && fdatasync (dst->fd) == -1)
        r = -errno;
      free (le);
    }
  }
  if (r == 0)
    for (uint64_t w = 0; w < dst->nwords; ++w)
      atomic_store (&dst->words[w], raw[w]);
  pthread_mutex_unlock (&dst->lock);
  free (raw);
  if (src->inconsistent && r == 0)
    cbt_bitmap_set_inconsistent (dst, "a dropped later checkpoint was "
                                 "inconsistent", 0);
  return r;
}
