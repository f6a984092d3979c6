/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: dm-snapshot's persistent exception store format (see
 * dm-format.h).  Shared by the persistent store and snapfgctl inspect.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>

#include "byte-order.h"
#include "dm-format.h"
#include "power-of-two.h"
#include "vector.h"

void
dm_header_encode (const struct dm_header *h, void *buf)
{
  unsigned char *p = buf;

  put_le32 (p, h->magic);
  put_le32 (p + 4, h->valid);
  put_le32 (p + 8, h->version);
  put_le32 (p + 12, h->chunk_sectors);
  /* The mark's whole field, bytes 16..31. */
  memset (p + SNAPFG_MERGE_MARK_OFFSET, 0,
          SNAPFG_UNSYNCED_MARK_OFFSET - SNAPFG_MERGE_MARK_OFFSET);
  if (h->snapfg_merging)
    memcpy (p + SNAPFG_MERGE_MARK_OFFSET, SNAPFG_MERGE_MARK,
            sizeof SNAPFG_MERGE_MARK);
  memset (p + SNAPFG_UNSYNCED_MARK_OFFSET, 0, 32);
  if (h->snapfg_unsynced_boot[0]) {
    memcpy (p + SNAPFG_UNSYNCED_MARK_OFFSET, SNAPFG_UNSYNCED_MARK, 4);
    memcpy (p + SNAPFG_UNSYNCED_MARK_OFFSET + 4, h->snapfg_unsynced_boot,
            strnlen (h->snapfg_unsynced_boot, SNAPFG_UNSYNCED_BOOT_LEN));
  }
}

void
dm_header_decode (const void *buf, struct dm_header *h)
{
  const unsigned char *p = buf;

  h->magic = get_le32 (p);
  h->valid = get_le32 (p + 4);
  h->version = get_le32 (p + 8);
  h->chunk_sectors = get_le32 (p + 12);
  h->snapfg_merging = memcmp (p + SNAPFG_MERGE_MARK_OFFSET, SNAPFG_MERGE_MARK,
                              sizeof SNAPFG_MERGE_MARK) == 0;
  h->snapfg_unsynced_boot[0] = '\0';
  if (memcmp (p + SNAPFG_UNSYNCED_MARK_OFFSET, SNAPFG_UNSYNCED_MARK, 4) == 0) {
    const char *id = (const char *) p + SNAPFG_UNSYNCED_MARK_OFFSET + 4;
    size_t len = strnlen (id, SNAPFG_UNSYNCED_BOOT_LEN);

    memcpy (h->snapfg_unsynced_boot, id, len);
    h->snapfg_unsynced_boot[len] = '\0';
    if (len == 0)               /* a mark without an id: no boot matches */
      strcpy (h->snapfg_unsynced_boot, "?");
  }
}

void
dm_pair_encode (void *buf, uint64_t old_chunk, uint64_t new_chunk)
{
  put_le64 (buf, old_chunk);
  put_le64 ((unsigned char *) buf + 8, new_chunk);
}

void
dm_pair_decode (const void *buf, uint64_t *old_chunk, uint64_t *new_chunk)
{
  *old_chunk = get_le64 (buf);
  *new_chunk = get_le64 ((const unsigned char *) buf + 8);
}

int
dm_read_header (const struct snapfg_device *dev, struct dm_header *h,
                enum dm_header_kind *kind, char *why, size_t why_len)
{
  unsigned char buf[512];
  int r;

  if (dev->size == 0) {
    *kind = DM_HEADER_EMPTY;
    return 0;
  }
  if (dev->size < sizeof buf) {
    snprintf (why, why_len, "too small (%" PRIu64 " bytes) to hold a "
              "dm-snapshot header and not all zero", dev->size);
    r = device_is_all_zero (dev);
    if (r == 1) {
      *kind = DM_HEADER_EMPTY;
      return 0;
    }
    return r < 0 ? r : -EINVAL;
  }
  r = device_pread (dev, buf, sizeof buf, 0);
  if (r < 0) {
    snprintf (why, why_len, "cannot read the header: %s", strerror (-r));
    return r;
  }
  dm_header_decode (buf, h);
  if (h->magic == 0) {
    /* dm treats a zero magic as a new store; we insist that the whole
     * device is zero, so that we never format over somebody's data.
     */
    r = device_is_all_zero (dev);
    if (r == 1) {
      *kind = DM_HEADER_EMPTY;
      return 0;
    }
    if (r < 0) {
      snprintf (why, why_len, "cannot read: %s", strerror (-r));
      return r;
    }
    snprintf (why, why_len, "no dm-snapshot header (magic 0) but the file "
              "is not all zero: not a COW store");
    return -EINVAL;
  }
  if (h->magic != DM_SNAP_MAGIC) {
    snprintf (why, why_len, "not a dm-snapshot COW store "
              "(magic 0x%08" PRIx32 ", expected 0x%08" PRIx32 " \"SnAp\")",
              h->magic, DM_SNAP_MAGIC);
    return -EINVAL;
  }
  if (h->version != DM_SNAP_VERSION) {
    snprintf (why, why_len, "unsupported dm-snapshot store version %" PRIu32
              " (only version %d is known)", h->version, DM_SNAP_VERSION);
    return -EINVAL;
  }
  if (!is_power_of_two (h->chunk_sectors) || h->chunk_sectors > 2048) {
    snprintf (why, why_len, "header chunk size %" PRIu32 " sectors is not a "
              "power of two between 1 and 2048 sectors (512 B to 1 MiB)",
              h->chunk_sectors);
    return -EINVAL;
  }
  if (h->valid > 1) {
    snprintf (why, why_len, "header valid field is %" PRIu32
              " (expected 0 or 1)", h->valid);
    return -EINVAL;
  }
  *kind = DM_HEADER_VALID;
  return 0;
}

/* Where a pair keeps its data, and which pair it is. */
struct pair_use {
  uint64_t new_chunk;
  uint64_t old_chunk;
  uint64_t area, index;
};
DEFINE_VECTOR_TYPE (pair_use_vector, struct pair_use);

static int
compare_pair_use (const void *a, const void *b)
{
  const struct pair_use *x = a, *y = b;

  if (x->new_chunk != y->new_chunk)
    return x->new_chunk < y->new_chunk ? -1 : 1;
  /* Then in table order, so that the message names the earlier first. */
  if (x->area != y->area)
    return x->area < y->area ? -1 : 1;
  return x->index < y->index ? -1 : (x->index > y->index);
}

/* Two pairs keeping their data in one COW chunk would make two origin
 * chunks read the same data, and a write to either change both: dm
 * never writes such a table, so it is damaged (or made by hand).  The
 * pairs come mostly in allocation order; sorting is needed only when
 * they do not.
 */
static int
check_chunks_used_once (pair_use_vector *uses, bool in_order,
                        char *why, size_t why_len)
{
  if (!in_order)
    qsort (uses->ptr, uses->len, sizeof uses->ptr[0], compare_pair_use);
  for (size_t k = 1; k < uses->len; ++k) {
    const struct pair_use *a = &uses->ptr[k - 1], *b = &uses->ptr[k];

    if (a->new_chunk == b->new_chunk) {
      snprintf (why, why_len, "metadata area %" PRIu64 " pair %" PRIu64
                " (origin chunk %" PRIu64 ") and metadata area %" PRIu64
                " pair %" PRIu64 " (origin chunk %" PRIu64 ") both keep "
                "their data in COW chunk %" PRIu64 ": the table is damaged",
                a->area, a->index, a->old_chunk, b->area, b->index,
                b->old_chunk, a->new_chunk);
      return -EINVAL;
    }
  }
  return 0;
}

int
dm_load_exceptions (const struct snapfg_device *dev, uint32_t chunk_size,
                    uint64_t origin_chunks, dm_pair_fn fn, void *opaque,
                    struct dm_load_result *result, char *why, size_t why_len)
{
  const uint64_t ppa = dm_pairs_per_area (chunk_size);
  const uint64_t dev_chunks = dev->size / chunk_size;
  unsigned char *area_buf;
  uint64_t area;
  pair_use_vector uses = { 0 };
  bool in_order = true;
  int r = 0;

  memset (result, 0, sizeof *result);
  result->next_free = 2;        /* after the header and area 0 */
  area_buf = malloc (chunk_size);
  if (area_buf == NULL)
    return -ENOMEM;

  for (area = 0; ; ++area) {
    uint64_t location = dm_area_chunk (area, ppa);
    uint64_t i;

    if (location >= dev_chunks) {
      snprintf (why, why_len, "truncated: metadata area %" PRIu64
                " (chunk %" PRIu64 ") is past the end of the file "
                "(%" PRIu64 " bytes)", area, location, dev->size);
      r = -EINVAL;
      break;
    }
    r = device_pread (dev, area_buf, chunk_size, location * chunk_size);
    if (r < 0) {
      snprintf (why, why_len, "cannot read metadata area %" PRIu64 ": %s",
                area, strerror (-r));
      break;
    }
    for (i = 0; i < ppa; ++i) {
      uint64_t old_chunk, new_chunk;

      dm_pair_decode (area_buf + i * DM_SNAP_PAIR_SIZE,
                      &old_chunk, &new_chunk);
      if (new_chunk == 0)
        break;                  /* the end of the table */
      if (new_chunk >= dev_chunks) {
        snprintf (why, why_len, "metadata area %" PRIu64 " pair %" PRIu64
                  " points past the end of the store (new chunk %" PRIu64
                  ", the file has %" PRIu64 " chunks)",
                  area, i, new_chunk, dev_chunks);
        r = -EINVAL;
        break;
      }
      if (dm_is_metadata_chunk (new_chunk, ppa)) {
        if (new_chunk == 0)
          snprintf (why, why_len, "metadata area %" PRIu64 " pair %" PRIu64
                    " (origin chunk %" PRIu64 ") points at chunk 0, the "
                    "header: the table is damaged", area, i, old_chunk);
        else
          snprintf (why, why_len, "metadata area %" PRIu64 " pair %" PRIu64
                    " (origin chunk %" PRIu64 ") points at metadata chunk %"
                    PRIu64 " (metadata area %" PRIu64 "): the table is "
                    "damaged", area, i, old_chunk, new_chunk,
                    (new_chunk - 1) / (ppa + 1));
        r = -EINVAL;
        break;
      }
      if (origin_chunks && old_chunk >= origin_chunks) {
        snprintf (why, why_len, "metadata area %" PRIu64 " pair %" PRIu64
                  " remaps origin chunk %" PRIu64 ", past the end of the "
                  "origin (%" PRIu64 " chunks)",
                  area, i, old_chunk, origin_chunks);
        r = -EINVAL;
        break;
      }
      r = fn (opaque, old_chunk, new_chunk);
      if (r == -EEXIST) {
        snprintf (why, why_len, "two pairs for origin chunk %" PRIu64
                  " (the second in metadata area %" PRIu64 " pair %" PRIu64
                  ")", old_chunk, area, i);
        r = -EINVAL;
      }
      if (r < 0)
        break;
      if (uses.len > 0 && new_chunk <= uses.ptr[uses.len - 1].new_chunk)
        in_order = false;
      r = pair_use_vector_append (&uses, (struct pair_use) {
          .new_chunk = new_chunk, .old_chunk = old_chunk,
          .area = area, .index = i });
      if (r < 0) {
        snprintf (why, why_len, "out of memory for %" PRIu64 " pairs",
                  result->exceptions + 1);
        break;
      }
      result->exceptions++;
      if (new_chunk + 1 > result->next_free)
        result->next_free = new_chunk + 1;
    }
    if (r < 0)
      break;
    if (i < ppa) {              /* found the terminator in this area */
      result->current_area = area;
      result->area_used = i;
      break;
    }
  }
  free (area_buf);
  if (r == 0)
    r = check_chunks_used_once (&uses, in_order, why, why_len);
  pair_use_vector_reset (&uses);
  result->next_free = dm_skip_metadata (result->next_free, ppa);
  return r;
}
