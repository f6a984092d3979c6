/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: little-endian integers in byte buffers.
 *
 * Every on-disk format of snapfg (dm-snapshot's exception store, the
 * store's binding record, checkpoint bitmaps, snapfg-backup's sums
 * files) is little endian.  These read and write one field at any byte
 * offset: through memcpy, so the buffer need not be aligned.
 */
#ifndef SNAPFG_BYTE_ORDER_H
#define SNAPFG_BYTE_ORDER_H

#include <stdint.h>
#include <string.h>
#include <endian.h>

static inline void
put_le16 (void *p, uint16_t v)
{
  uint16_t le = htole16 (v);
  memcpy (p, &le, sizeof le);
}

static inline void
put_le32 (void *p, uint32_t v)
{
  uint32_t le = htole32 (v);
  memcpy (p, &le, sizeof le);
}

static inline void
put_le64 (void *p, uint64_t v)
{
  uint64_t le = htole64 (v);
  memcpy (p, &le, sizeof le);
}

static inline uint16_t
get_le16 (const void *p)
{
  uint16_t le;
  memcpy (&le, p, sizeof le);
  return le16toh (le);
}

static inline uint32_t
get_le32 (const void *p)
{
  uint32_t le;
  memcpy (&le, p, sizeof le);
  return le32toh (le);
}

static inline uint64_t
get_le64 (const void *p)
{
  uint64_t le;
  memcpy (&le, p, sizeof le);
  return le64toh (le);
}

#endif
