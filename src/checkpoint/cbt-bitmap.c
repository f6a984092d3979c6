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

#include "boot-id.h"
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


void
cbt_boot_id (char id[CBT_BOOT_ID_LEN])
{
  memset (id, 0, CBT_BOOT_ID_LEN);      /* the header holds all of it */
  if (read_boot_id (id, CBT_BOOT_ID_LEN) < 0) {
    /* No boot id: every open after a crash will call the bitmap
     * inconsistent, which is safe.
     */
    snprintf (id, CBT_BOOT_ID_LEN, "unknown-%ld", (long) getpid ());
  }
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
#define HDR_CATALOGUE 88               /* 36 characters, NUL-padded to 40 */
#define HDR_SEQ 128                    /* le64 */
#define HDR_NAME 136                   /* CBT_NAME_LEN bytes */
#define HDR_ORIGIN_DEV 264             /* le64 */
#define HDR_ORIGIN_INO 272             /* le64 */
#define HDR_BITS_SUM 280               /* le64 */

/* The checksum of the bits a clean close writes: 64-bit FNV-1a over the
 * words (a word at a time: a changed, moved or missing word changes it).
 */
static uint64_t
bits_checksum (const struct cbt_bitmap *bm)
{
  uint64_t h = UINT64_C (0xcbf29ce484222325);

  for (uint64_t w = 0; w < bm->nwords; ++w) {
    h ^= atomic_load (&((struct cbt_bitmap *) bm)->words[w]);
    h *= UINT64_C (0x100000001b3);
  }
  return h;
}

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
  if (bm->bound) {
    const struct cbt_binding *b = &bm->binding;

    memcpy (buf + HDR_CATALOGUE, b->catalogue_id, strlen (b->catalogue_id));
    put_le64 (buf + HDR_SEQ, b->seq);
    memcpy (buf + HDR_NAME, b->name, strnlen (b->name, CBT_NAME_LEN));
    put_le64 (buf + HDR_ORIGIN_DEV, b->origin_dev);
    put_le64 (buf + HDR_ORIGIN_INO, b->origin_ino);
    put_le32 (buf + HDR_FLAGS, flags | CBT_FLAG_BOUND);
  }
  if (flags & CBT_FLAG_SUMMED)
    put_le64 (buf + HDR_BITS_SUM, bits_checksum (bm));
}

static void
decode_binding (const unsigned char *buf, struct cbt_binding *b)
{
  memset (b, 0, sizeof *b);
  memcpy (b->catalogue_id, buf + HDR_CATALOGUE, 36);
  b->seq = get_le64 (buf + HDR_SEQ);
  memcpy (b->name, buf + HDR_NAME, CBT_NAME_LEN);
  b->origin_dev = get_le64 (buf + HDR_ORIGIN_DEV);
  b->origin_ino = get_le64 (buf + HDR_ORIGIN_INO);
}

/* Write the header with these flags and sync it (the caller holds
 * bm->lock or is alone with the bitmap).  A clean header (neither DIRTY
 * nor INCONSISTENT) carries the bits' checksum: the caller has synced
 * the bits, and the words in memory are what the file holds.  A foreign
 * bitmap (another checkpoint's file) is never written.
 */
static int
write_header (struct cbt_bitmap *bm, uint32_t flags)
{
  unsigned char buf[CBT_HEADER_SIZE];
  int r;

  if (bm->fd < 0 || bm->foreign)
    return 0;
  if (!(flags & (CBT_FLAG_DIRTY | CBT_FLAG_INCONSISTENT)))
    flags |= CBT_FLAG_SUMMED;
  encode_header (bm, flags, buf);
  r = full_pwrite (bm->fd, buf, sizeof buf, 0);
  if (r == 0 && fdatasync (bm->fd) == -1)
    r = -errno;
  if (r == 0)
    bm->header_dirty = flags & CBT_FLAG_DIRTY;
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
                   uint64_t origin_size, const struct cbt_binding *binding,
                   struct cbt_bitmap **bmp)
{
  struct cbt_bitmap *bm = bitmap_alloc (path, granularity, origin_size);
  int r;

  if (bm == NULL)
    return -ENOMEM;
  if (binding) {
    bm->binding = *binding;
    bm->binding.origin_moved = false;
    bm->bound = true;
  }
  bm->created = time (NULL);
  bm->fd = open (path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (bm->fd == -1) {
    r = -errno;
    if (r == -EEXIST)
      snapfg_fail_logged (-r, "checkpoint bitmap %s: already exists; refusing to "
                              "replace a file this server did not create (remove it "
                              "if it is a leftover)", path);
    else
      snapfg_fail_logged (-r, "checkpoint bitmap %s: cannot create: %s", path,
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
    snapfg_fail_logged (-r, "checkpoint bitmap %s: cannot write: %s", path,
                            strerror (-r));
    bitmap_free (bm);
    unlink (path);
    return r;
  }
  *bmp = bm;
  return 0;
}

/* Is the bitmap bound to 'expect'?  If not, say how in why and mark it
 * inconsistent (foreign: another catalogue's or checkpoint's file).  An
 * unbound bitmap (an older snapfg's) and one whose origin moved with
 * origin-moved=true take the expected binding.
 */
static void
check_binding (struct cbt_bitmap *bm, const struct cbt_binding *expect,
               char *why, size_t why_len)
{
  const struct cbt_binding *b = &bm->binding;

  if (bm->bound) {
    if (strcmp (b->catalogue_id, expect->catalogue_id) != 0) {
      snprintf (why, why_len, "belongs to another catalogue (id %s, not %s): "
                "another server's or origin's bitmap", b->catalogue_id,
                expect->catalogue_id);
      bm->foreign = true;
    }
    else if (b->seq != expect->seq || strcmp (b->name, expect->name) != 0) {
      snprintf (why, why_len, "belongs to checkpoint \"%s\" (number %" PRIu64
                "), not to \"%s\" (number %" PRIu64 ")", b->name, b->seq,
                expect->name, expect->seq);
      bm->foreign = true;
    }
    else if (b->origin_ino != 0 && expect->origin_ino != 0 &&
             (b->origin_dev != expect->origin_dev ||
              b->origin_ino != expect->origin_ino)) {
      if (!expect->origin_moved) {
        snprintf (why, why_len, "tracked another origin (device %" PRIu64
                  " inode %" PRIu64 "; the origin is device %" PRIu64
                  " inode %" PRIu64 " now: it was replaced; if it really "
                  "moved, start with origin-moved=true)", b->origin_dev,
                  b->origin_ino, expect->origin_dev, expect->origin_ino);
        atomic_store (&bm->inconsistent, true);
        return;
      }
      snapfg_notice ("checkpoint bitmap %s: origin-moved=true: it tracked "
                     "device %" PRIu64 " inode %" PRIu64 ", rebound to the "
                     "origin as it is now", bm->path, b->origin_dev,
                     b->origin_ino);
    }
    if (bm->foreign) {
      atomic_store (&bm->inconsistent, true);
      return;
    }
  }
  bm->binding = *expect;
  bm->binding.origin_moved = false;
  bm->bound = true;
}

int
cbt_bitmap_open (const char *path, uint64_t origin_size,
                 const struct cbt_binding *expect,
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
  bm->header_dirty = flags & CBT_FLAG_DIRTY;
  if (flags & CBT_FLAG_BOUND) {
    decode_binding (buf, &bm->binding);
    bm->bound = true;
  }
  if (expect) {
    check_binding (bm, expect, why, why_len);
    if (atomic_load (&bm->inconsistent)) {
      *bmp = bm;
      return 0;
    }
  }
  memcpy (boot_id, buf + HDR_BOOT_ID, CBT_BOOT_ID_LEN);
  boot_id[CBT_BOOT_ID_LEN - 1] = '\0';
  if ((flags & CBT_FLAG_SUMMED) &&
      !(flags & (CBT_FLAG_DIRTY | CBT_FLAG_INCONSISTENT)) &&
      get_le64 (buf + HDR_BITS_SUM) != bits_checksum (bm)) {
    /* Not flagged in the file: the catalogue records it, and the file
     * stays as it was found.
     */
    snprintf (why, why_len, "its bits do not match the checksum its last "
              "clean close wrote: the file was damaged or changed since");
    atomic_store (&bm->inconsistent, true);
  }
  else if (flags & CBT_FLAG_INCONSISTENT) {
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
  bool was_clean = false;
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
  /* A clean file's checksum would no longer match: say DIRTY first
   * (durably), and clean again, with the new checksum, once the new bits
   * are durable.
   */
  if (dst->fd >= 0 && !dst->header_dirty && !dst->foreign) {
    was_clean = true;
    r = write_header (dst, current_flags (dst, true));
  }
  if (r == 0 && dst->fd >= 0) {
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
  if (r == 0 && was_clean)
    r = write_header (dst, current_flags (dst, false));
  pthread_mutex_unlock (&dst->lock);
  free (raw);
  if (src->inconsistent && r == 0)
    cbt_bitmap_set_inconsistent (dst, "a dropped later checkpoint was "
                                 "inconsistent", 0);
  return r;
}
