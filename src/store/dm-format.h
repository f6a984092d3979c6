/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: Linux dm-snapshot's persistent exception store format.
 *
 * Written from the format's description (docs/design.md section 5), little
 * endian throughout:
 *
 *   chunk 0            header: magic "SnAp" (0x70416e53), valid, version 1,
 *                      chunk size in 512-byte sectors (4 x le32)
 *   chunk 1            metadata area 0: chunk_size / 16 pairs of
 *                      (le64 old_chunk, le64 new_chunk)
 *   chunks 2 ..        the data chunks area 0 describes
 *   chunk 1 + (P+1)*i  metadata area i (P = pairs per area), and so on.
 *
 * A pair with new_chunk == 0 ends the table (chunk 0 is the header, so no
 * exception can live there).  Areas are filled in commit order.
 */
#ifndef SNAPFG_DM_FORMAT_H
#define SNAPFG_DM_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "boot-id.h"
#include "device.h"

#define DM_SNAP_MAGIC   UINT32_C (0x70416e53)
#define DM_SNAP_VERSION 1
#define DM_SNAP_HEADER_SIZE 16
#define DM_SNAP_PAIR_SIZE 16
#define SNAPFG_BOOT_ID_MAX BOOT_ID_SIZE
#define SNAPFG_UNSYNCED_BOOT_LEN 28 /* as much of it as the mark holds */

struct dm_header {
  uint32_t magic;
  uint32_t valid;
  uint32_t version;
  uint32_t chunk_sectors;
  /* snapfg's own mark, in the header chunk after dm's 16 bytes (which
   * the kernel does not read; it clears them only when it invalidates
   * the store): a merge back into the origin is in progress and resumes
   * on restart.
   */
  bool snapfg_merging;
  /* snapfg's unsynced mark (durability=flush): while a server writes the
   * store without a sync per commit, the header says valid = 0 (so that
   * the kernel never uses a store that a power loss may have torn) and
   * this names the boot (the kernel's boot id, its first
   * SNAPFG_UNSYNCED_BOOT_LEN characters: 24 hex digits of a random UUID)
   * that wrote it.  Empty: no mark.
   */
  char snapfg_unsynced_boot[SNAPFG_UNSYNCED_BOOT_LEN + 1];
};

#define SNAPFG_MERGE_MARK "snapfg:merging"
#define SNAPFG_MERGE_MARK_OFFSET DM_SNAP_HEADER_SIZE
/* Bytes 32..63 of the header chunk: "SFGu" and the boot id, NUL-padded
 * (64 and up belong to the binding record).
 */
#define SNAPFG_UNSYNCED_MARK "SFGu"
#define SNAPFG_UNSYNCED_MARK_OFFSET 32

static inline uint64_t
dm_pairs_per_area (uint32_t chunk_size)
{
  return chunk_size / DM_SNAP_PAIR_SIZE;
}

/* The chunk holding metadata area 'area'. */
static inline uint64_t
dm_area_chunk (uint64_t area, uint64_t pairs_per_area)
{
  return 1 + (pairs_per_area + 1) * area;
}

/* Is 'chunk' the header or a metadata area (never a data chunk)? */
static inline bool
dm_is_metadata_chunk (uint64_t chunk, uint64_t pairs_per_area)
{
  return chunk == 0 || (chunk - 1) % (pairs_per_area + 1) == 0;
}

extern void dm_header_encode (const struct dm_header *h, void *buf);
extern void dm_header_decode (const void *buf, struct dm_header *h);
extern void dm_pair_encode (void *buf, uint64_t old_chunk, uint64_t new_chunk);
extern void dm_pair_decode (const void *buf, uint64_t *old_chunk,
                            uint64_t *new_chunk);

/* What the header of a COW device says. */
enum dm_header_kind {
  DM_HEADER_EMPTY,          /* empty or all-zero: a new store */
  DM_HEADER_VALID,          /* a store (h->valid may still be 0) */
};

/* Read and check the header.  On a problem, fills 'why' and returns
 * -EINVAL (or a negative errno from the read).
 */
extern int dm_read_header (const struct snapfg_device *dev,
                           struct dm_header *h, enum dm_header_kind *kind,
                           char *why, size_t why_len);

/* Where loading the exception table ended. */
struct dm_load_result {
  uint64_t exceptions;      /* pairs loaded */
  uint64_t current_area;    /* the area holding the terminator */
  uint64_t area_used;       /* pairs in current_area */
  uint64_t next_free;       /* first chunk after every used data chunk */
};

/* Called for each pair; a negative return stops loading.  -EEXIST means
 * the old chunk was already seen.
 */
typedef int (*dm_pair_fn) (void *opaque, uint64_t old_chunk,
                           uint64_t new_chunk);

/* Read every metadata area of a store with the given chunk size, check
 * each pair and pass it to fn.  'origin_chunks' bounds old_chunk (0: no
 * bound).  On a problem, fills 'why' and returns -EINVAL.
 */
extern int dm_load_exceptions (const struct snapfg_device *dev,
                               uint32_t chunk_size, uint64_t origin_chunks,
                               dm_pair_fn fn, void *opaque,
                               struct dm_load_result *result,
                               char *why, size_t why_len);

/* The first data chunk at or after 'chunk' (skips metadata areas). */
static inline uint64_t
dm_skip_metadata (uint64_t chunk, uint64_t pairs_per_area)
{
  while (dm_is_metadata_chunk (chunk, pairs_per_area))
    chunk++;
  return chunk;
}

#endif
