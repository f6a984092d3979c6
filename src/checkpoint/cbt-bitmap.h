/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: a persistent dirty bitmap of the origin (one checkpoint's).
 *
 * One bit per granule of the origin (the granularity is a power of two);
 * a set bit means "this granule may have changed since the checkpoint's
 * instant".  The bitmap lives in memory as atomic 64-bit words and in a
 * file (STATE.d/NAME.cbt) that mirrors them.  The file format:
 *
 *   offset  size  field (little-endian)
 *        0     8  magic "SNAPFGCB"
 *        8     4  version (1)
 *       12     4  header size in bytes (4096): the bits start here
 *       16     4  granularity in bytes
 *       20     4  flags: 1 DIRTY (in use by a server: some bits may be
 *                 only in the page cache), 2 INCONSISTENT (a bitmap
 *                 write failed or the system stopped uncleanly while
 *                 DIRTY: the bits may miss changes), 4 BOUND (the
 *                 binding below is filled in), 8 SUMMED (the bits'
 *                 checksum below is that of a clean close)
 *       24     8  origin size in bytes
 *       32     8  number of granules (bits)
 *       40    40  boot id (/proc/sys/kernel/random/boot_id) of the system
 *                 that set DIRTY, NUL-padded
 *       80     8  creation time (Unix seconds)
 *       88    40  the binding: the catalogue's id (36 characters)
 *      128     8    the checkpoint's sequence number
 *      136   128    the checkpoint's name (NUL-padded)
 *      264     8    the origin's device (st_dev; 0 for a block device)
 *      272     8    the origin's inode (st_ino; a block device's st_rdev;
 *                   0 with the device: no identity, an NBD origin)
 *      280     8  checksum of the bits (64-bit FNV-1a over the words),
 *                 written by a clean close (SUMMED)
 *      288  3808  zero
 *     4096     .  the bits: 64-bit words, granule g is bit g % 64 of
 *                 word g / 64; the bits past the last granule are zero
 *
 * Ordering (why a kill -9 never loses an acknowledged change): the first
 * change to a granule sets its bit in a pwrite of the file *before* the
 * origin changes, and only then publishes the bit in memory, so a writer
 * that finds the bit set in memory knows it is in the file (at least in
 * the page cache, which survives the process).  A flush syncs the file
 * before the origin's flush.  DIRTY is made durable before the first bit
 * can be set; a clean close syncs the bits and clears DIRTY.  At open, a
 * DIRTY file written under the same boot id is complete (only the
 * process died); under another boot id the page cache may have been lost
 * with the system, so the bitmap is INCONSISTENT.
 *
 * Binding (why a bitmap is never read for the wrong checkpoint): the
 * header names the catalogue, the checkpoint (sequence number and name)
 * and the origin's identity it tracks.  At open, a bitmap of another
 * catalogue or checkpoint is *foreign*: inconsistent, and never written
 * (it is somebody else's file); one of another origin identity is
 * inconsistent unless origin-moved=true vouches for it (then rebound).
 * A clean bitmap whose bits do not give the checksum its clean close
 * wrote was changed since: inconsistent.  A bitmap without a binding
 * (written by an older snapfg) is taken as the checkpoint's and bound at
 * its next header write.
 *
 * The hot path (cbt_bitmap_mark with every granule already set) is one
 * atomic load per 64 granules touched and one for the inconsistent flag.
 */
#ifndef SNAPFG_CBT_BITMAP_H
#define SNAPFG_CBT_BITMAP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "boot-id.h"
#include "chunk-size.h"           /* the granularity rule */

#define CBT_MAGIC "SNAPFGCB"
#define CBT_VERSION 1
#define CBT_HEADER_SIZE 4096
#define CBT_FLAG_DIRTY        (1u << 0)
#define CBT_FLAG_INCONSISTENT (1u << 1)
#define CBT_FLAG_BOUND        (1u << 2)
#define CBT_FLAG_SUMMED       (1u << 3)
#define CBT_NAME_LEN 128
#define CBT_BOOT_ID_LEN BOOT_ID_SIZE

/* Whose a bitmap is (the header's binding). */
struct cbt_binding {
  char catalogue_id[37];
  uint64_t seq;
  char name[CBT_NAME_LEN + 1];
  uint64_t origin_dev, origin_ino;   /* both 0: no identity */
  bool origin_moved;                 /* (expected only) origin-moved=true:
                                        another identity is accepted */
};

struct cbt_bitmap {
  char *path;
  int fd;                       /* -1: no file (a test's in-memory bitmap) */
  uint32_t granularity;
  unsigned shift;               /* log2 (granularity) */
  uint64_t origin_size;
  uint64_t granules;
  uint64_t nwords;
  uint64_t created;
  _Atomic uint64_t *words;
  atomic_bool inconsistent;
  /* Bits written to the file since the last sync (a flush skips the
   * sync when nothing changed).
   */
  atomic_uint_least64_t written_gen, synced_gen;
  pthread_mutex_t lock;         /* first writes to granules, header writes */
  char boot_id[CBT_BOOT_ID_LEN];
  struct cbt_binding binding;
  bool bound;                   /* binding is known (written with the
                                   next header) */
  bool foreign;                 /* another catalogue's or checkpoint's
                                   file: inconsistent, never written */
  bool header_dirty;            /* the header on disk says DIRTY */
  /* Called once when the bitmap becomes inconsistent at run time (a
   * write failed), so that its owner can record it elsewhere.
   */
  void (*on_inconsistent) (struct cbt_bitmap *bm, void *opaque);
  void *opaque;
};


/* This system's boot id (SNAPFG_TEST_BOOT_ID overrides it, so that tests
 * can simulate an unclean system stop).
 */
extern void cbt_boot_id (char id[CBT_BOOT_ID_LEN]);

/* Create a new bitmap file at path (O_EXCL: never replaces anything),
 * all bits clear, DIRTY, bound to 'binding' (NULL: none), durable (file
 * and directory) before returning.  On error, logs a message naming the
 * file and removes what it created.
 */
extern int cbt_bitmap_create (const char *path, uint32_t granularity,
                              uint64_t origin_size,
                              const struct cbt_binding *binding,
                              struct cbt_bitmap **bmp);

/* Open an existing bitmap file for origin_size, expected to be bound to
 * 'expect' (NULL: no check).  A file that is not a checkpoint bitmap,
 * or one for another origin size, is refused (with a message in why); a
 * DIRTY one from another boot, one flagged INCONSISTENT, one bound to
 * another catalogue, checkpoint or origin, and a clean one whose bits
 * do not match their checksum open with bm->inconsistent set and the
 * reason in why.
 */
extern int cbt_bitmap_open (const char *path, uint64_t origin_size,
                            const struct cbt_binding *expect,
                            struct cbt_bitmap **bmp,
                            char *why, size_t why_len);

/* Mark DIRTY (with this boot id), durably: before the bitmap tracks. */
extern int cbt_bitmap_set_dirty (struct cbt_bitmap *bm);
/* Sync the bits, then clear DIRTY durably: no more changes will come
 * (a clean close, or the checkpoint was frozen).
 */
extern int cbt_bitmap_set_clean (struct cbt_bitmap *bm);
/* Make every bit written so far durable (a flush). */
extern int cbt_bitmap_sync (struct cbt_bitmap *bm);
/* Flag INCONSISTENT in memory and (best effort) in the file. */
extern void cbt_bitmap_set_inconsistent (struct cbt_bitmap *bm,
                                         const char *why, int err);

/* A bitmap in memory only (no file), all clear: for computing unions. */
extern struct cbt_bitmap *cbt_bitmap_new_memory (uint32_t granularity,
                                                 uint64_t origin_size);

extern void cbt_bitmap_close (struct cbt_bitmap *bm);

/* The slow path of cbt_bitmap_mark. */
extern void cbt_bitmap_mark_slow (struct cbt_bitmap *bm, uint64_t first,
                                  uint64_t last);

static inline bool
cbt_word_range_set (struct cbt_bitmap *bm, uint64_t first, uint64_t last)
{
  for (uint64_t w = first >> 6; w <= last >> 6; ++w) {
    uint64_t lo = w == first >> 6 ? (first & 63) : 0;
    uint64_t hi = w == last >> 6 ? (last & 63) : 63;
    uint64_t mask = (hi == 63 ? ~UINT64_C (0) : (UINT64_C (1) << (hi + 1)) - 1)
      & ~((UINT64_C (1) << lo) - 1);

    if ((atomic_load_explicit (&bm->words[w], memory_order_acquire) & mask)
        != mask)
      return false;
  }
  return true;
}

/* Record a change of [offset, offset+count) (count > 0), before the
 * change is made.  Never fails: a bitmap write error makes the bitmap
 * inconsistent (and says so) and the change goes ahead.
 */
static inline void
cbt_bitmap_mark (struct cbt_bitmap *bm, uint64_t offset, uint64_t count)
{
  uint64_t first, last;

  if (offset >= bm->origin_size)
    return;
  if (count > bm->origin_size - offset)
    count = bm->origin_size - offset;
  first = offset >> bm->shift;
  last = (offset + count - 1) >> bm->shift;
  if (cbt_word_range_set (bm, first, last))
    return;
  if (atomic_load_explicit (&bm->inconsistent, memory_order_relaxed))
    return;
  cbt_bitmap_mark_slow (bm, first, last);
}

/* Is granule g set? */
static inline bool
cbt_bitmap_test (const struct cbt_bitmap *bm, uint64_t g)
{
  return (atomic_load_explicit (&((struct cbt_bitmap *) bm)->words[g >> 6],
                                memory_order_acquire) >> (g & 63)) & 1;
}

/* The number of set bits. */
extern uint64_t cbt_bitmap_count (const struct cbt_bitmap *bm);

/* dst |= src, in memory and durably in dst's file (dst is not tracking:
 * nobody else writes it meanwhile).  Both have the same geometry.
 */
extern int cbt_bitmap_or (struct cbt_bitmap *dst,
                          const struct cbt_bitmap *src);

#endif
