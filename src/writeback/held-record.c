/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: the held file's header, mark and records (see
 * held-record.h).
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "held-record.h"
#include "byte-order.h"
#include "crc32c.h"

#define RECORD_MAGIC "HWR1"

static uint64_t
round_up (uint64_t v, uint64_t to)
{
  return (v + to - 1) / to * to;
}

void
held_layout_of (uint32_t slots, uint32_t max_stores, struct held_layout *l)
{
  l->header_len = round_up (HELD_HEADER_FIXED +
                            (uint64_t) max_stores * HELD_UUID_LEN, HELD_PAGE);
  l->mark_off = l->header_len;
  l->ring_off = l->mark_off + HELD_MARK_LEN;
  l->data_off = round_up (l->ring_off + (uint64_t) slots * HELD_RECORD_LEN,
                          1024 * 1024);
}

/* --- header --- */

static void
put_string (unsigned char *p, const char *s, size_t len)
{
  size_t n = strnlen (s, len - 1);

  memcpy (p, s, n);
}

static bool
get_string (const unsigned char *p, size_t len, char *s)
{
  /* NUL-terminated within its field, and nothing after the NUL. */
  size_t n = strnlen ((const char *) p, len);

  if (n == len)
    return false;
  for (size_t i = n; i < len; ++i)
    if (p[i])
      return false;
  memcpy (s, p, n + 1);
  return true;
}

void
held_header_encode (const struct held_header *h, const struct held_layout *l,
                    void *buf)
{
  unsigned char *p = buf;

  memset (p, 0, l->header_len);
  memcpy (p, HELD_MAGIC, 8);
  put_le32 (p + 8, HELD_VERSION);
  put_le64 (p + 16, h->created);
  put_le32 (p + 24, h->pid);
  put_le32 (p + 28, h->nstores);
  put_string (p + 32, h->boot_id, HELD_BOOT_ID_LEN);
  put_le64 (p + 72, h->origin_dev);
  put_le64 (p + 80, h->origin_ino);
  put_le64 (p + 88, h->origin_size);
  put_le32 (p + 96, h->slots);
  put_le32 (p + 100, h->max_stores);
  put_le64 (p + 104, l->header_len);
  put_string (p + 112, h->origin_path, HELD_PATH_LEN);
  for (uint32_t i = 0; i < h->nstores; ++i)
    put_string (p + HELD_HEADER_FIXED + i * HELD_UUID_LEN, h->stores[i],
                HELD_UUID_LEN);
  put_le32 (p + 12, crc32c (0, p, l->header_len));
}

const char *
held_header_decode (const void *buf, size_t len, struct held_header *h,
                    struct held_layout *l)
{
  const unsigned char *p = buf;
  uint64_t header_len;
  uint32_t crc;

  if (len < HELD_HEADER_FIXED || memcmp (p, HELD_MAGIC, 8) != 0)
    return "it is not a snapfg held file (no SNAPFGHW magic)";
  if (get_le32 (p + 8) != HELD_VERSION)
    return "its version is not 1";
  h->slots = get_le32 (p + 96);
  h->max_stores = get_le32 (p + 100);
  header_len = get_le64 (p + 104);
  if (h->slots == 0 || h->slots > (1u << 28) || h->max_stores > (1u << 20))
    return "its header gives an impossible ring or store count";
  held_layout_of (h->slots, h->max_stores, l);
  if (header_len != l->header_len || header_len > len)
    return "its header length does not match its counts";
  /* The checksum, computed with its own field as zero. */
  crc = get_le32 (p + 12);
  {
    uint32_t c = crc32c (0, p, 12);

    c = crc32c (c, "\0\0\0\0", 4);
    c = crc32c (c, p + 16, header_len - 16);
    if (c != crc)
      return "its header checksum is wrong";
  }
  h->created = get_le64 (p + 16);
  h->pid = get_le32 (p + 24);
  h->nstores = get_le32 (p + 28);
  if (h->nstores > h->max_stores)
    return "its header lists more stores than it has room for";
  if (!get_string (p + 32, HELD_BOOT_ID_LEN, h->boot_id) ||
      !get_string (p + 112, HELD_PATH_LEN, h->origin_path))
    return "a text field of its header is not terminated";
  h->origin_dev = get_le64 (p + 72);
  h->origin_ino = get_le64 (p + 80);
  h->origin_size = get_le64 (p + 88);
  h->stores = (char (*)[HELD_UUID_LEN]) (p + HELD_HEADER_FIXED);
  for (uint32_t i = 0; i < h->nstores; ++i) {
    char uuid[HELD_UUID_LEN];

    if (!get_string (p + HELD_HEADER_FIXED + i * HELD_UUID_LEN,
                     HELD_UUID_LEN, uuid) || uuid[0] == '\0')
      return "a store uuid in its header is not valid";
  }
  return NULL;
}

/* --- the applied mark --- */

void
held_mark_encode (uint64_t seq, void *buf)
{
  put_le64 ((unsigned char *) buf + 8, ~seq);
  put_le64 (buf, seq);
}

const char *
held_mark_decode (const void *buf, uint64_t *seq)
{
  uint64_t s = get_le64 (buf);
  uint64_t check = get_le64 ((const unsigned char *) buf + 8);

  /* A file created and never applied to has both zero. */
  if (s == 0 && check == 0) {
    *seq = 0;
    return NULL;
  }
  if (check != ~s)
    return "its applied mark is damaged";
  *seq = s;
  return NULL;
}

/* --- records --- */

static uint32_t
record_crc (const unsigned char *p)
{
  uint32_t c = crc32c (0, p, 4);

  c = crc32c (c, "\0\0\0\0", 4);
  return crc32c (c, p + 8, HELD_RECORD_LEN - 8);
}

void
held_record_encode (const struct held_record *r, void *buf)
{
  unsigned char *p = buf;

  memset (p, 0, HELD_RECORD_LEN);
  memcpy (p, RECORD_MAGIC, 4);
  put_le64 (p + 8, r->seq);
  put_le64 (p + 16, r->offset);
  put_le64 (p + 24, r->data_off);
  put_le32 (p + 32, r->count);
  put_le32 (p + 36, r->data_crc);
  p[40] = r->op;
  p[41] = r->flags;
  p[42] = r->dropped;
  put_le32 (p + 4, record_crc (p));
}

bool
held_record_slot_empty (const void *buf)
{
  const unsigned char *p = buf;

  for (size_t i = 0; i < HELD_RECORD_LEN; ++i)
    if (p[i])
      return false;
  return true;
}

const char *
held_record_decode (const void *buf, struct held_record *r)
{
  const unsigned char *p = buf;

  if (held_record_slot_empty (p))
    return "empty";
  if (memcmp (p, RECORD_MAGIC, 4) != 0)
    return "no record magic";
  if (get_le32 (p + 4) != record_crc (p))
    return "its checksum is wrong";
  for (size_t i = 43; i < HELD_RECORD_LEN; ++i)
    if (p[i])
      return "its reserved bytes are not zero";
  r->seq = get_le64 (p + 8);
  r->offset = get_le64 (p + 16);
  r->data_off = get_le64 (p + 24);
  r->count = get_le32 (p + 32);
  r->data_crc = get_le32 (p + 36);
  r->op = p[40];
  r->flags = p[41];
  r->dropped = p[42] != 0;
  if (p[42] > 1 || (r->flags & ~HELD_FLAG_MAY_TRIM))
    return "its flags are not valid";
  if (r->op != HELD_OP_WRITE && r->op != HELD_OP_ZERO && r->op != HELD_OP_TRIM)
    return "its operation is not write, zero or trim";
  if (r->count == 0)
    return "its length is zero";
  if ((r->op == HELD_OP_WRITE) != (r->data_off != 0))
    return "it has data where it should have none, or none where it should";
  return NULL;
}

/* Is the record in the given slot fit to be replayed as seq?  NULL or
 * what is wrong.
 */
static const char *
record_check (const struct held_record *r, uint64_t seq, uint64_t data_off,
              uint64_t file_size, uint32_t max_count)
{
  if (r->seq != seq)
    return "its sequence number is out of place";
  if (r->count > max_count)
    return "its length is larger than any held write";
  if (r->offset + r->count < r->offset)
    return "its range wraps around";
  if (r->op == HELD_OP_WRITE &&
      (r->data_off < data_off || r->data_off % HELD_PAGE ||
       r->data_off + r->count > file_size || r->data_off + r->count < r->data_off))
    return "its data lies outside the file's data area";
  return NULL;
}

int
held_records_scan (const void *ring, uint32_t slots, uint64_t mark,
                   uint64_t data_off, uint64_t file_size, uint32_t max_count,
                   struct held_replay *out, char *why, size_t whylen)
{
  const unsigned char *base = ring;
  size_t cap = 0;

  out->r = NULL;
  out->n = 0;
  out->torn = false;
  for (uint64_t seq = mark + 1; seq - mark <= slots; ++seq) {
    const unsigned char *p = base + ((seq - 1) % slots) * HELD_RECORD_LEN;
    struct held_record r;
    const char *problem = held_record_decode (p, &r);

    if (problem && strcmp (problem, "empty") == 0)
      break;                    /* the end */
    if (problem == NULL && r.seq < seq)
      break;                    /* a record of an earlier lap: the end */
    if (problem && strcmp (problem, "its checksum is wrong") == 0) {
      /* Torn, if it is the last: the next slot must not go on. */
      const unsigned char *q = base + (seq % slots) * HELD_RECORD_LEN;
      struct held_record next;

      if (seq - mark < slots && held_record_decode (q, &next) == NULL &&
          next.seq > seq) {
        snprintf (why, whylen, "the record of held write %" PRIu64
                  " (slot %" PRIu64 ") fails its checksum, and held write "
                  "%" PRIu64 " follows it: the file was changed",
                  seq, (seq - 1) % slots, next.seq);
        goto invalid;
      }
      out->torn = true;
      out->torn_seq = seq;
      break;
    }
    if (problem == NULL)
      problem = record_check (&r, seq, data_off, file_size, max_count);
    if (problem) {
      snprintf (why, whylen, "the record in slot %" PRIu64 " (held write %"
                PRIu64 "): %s", (seq - 1) % slots, seq, problem);
      goto invalid;
    }
    if (out->n == cap) {
      size_t ncap = cap ? cap * 2 : 64;
      struct held_record *nr = realloc (out->r, ncap * sizeof *nr);

      if (nr == NULL) {
        free (out->r);
        out->r = NULL;
        return -ENOMEM;
      }
      out->r = nr;
      cap = ncap;
    }
    out->r[out->n++] = r;
  }
  return 0;

 invalid:
  free (out->r);
  out->r = NULL;
  out->n = 0;
  return -EINVAL;
}
