/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: the layout of the held file and its records
 * (held-record.c).  Pure encoding and checking: no I/O.  The file itself
 * (created, opened, mapped) is held-file.c.
 *
 * The held file lives on a memory file system (tmpfs), so that it
 * outlives a crash of the process but not a power cut.  Little-endian:
 *
 *   [0, header_len)            the header: what the file is bound to
 *   [header_len, + 4096)       the applied mark
 *   [ring_off, + 64 * slots)   the ring of records, one per held write
 *   [data_off, ...)            held data, in whole pages
 *
 * Header (fixed part, then nstores 40-byte store uuids at 1136):
 *     0  magic "SNAPFGHW"         8  u32 version (1)   12 u32 crc32c
 *    16  u64 created (s)         24  u32 pid          28 u32 nstores
 *    32  boot id (40 bytes, NUL padded)
 *    72  u64 origin dev   80 u64 origin inode   88 u64 origin size
 *    96  u32 slots       100 u32 max_stores
 *   104  u64 header_len  112 origin path (1024 bytes, NUL padded)
 *  1136  store uuids
 * The crc covers [0, header_len) with its own field zero.
 *
 * Applied mark: u64 seq at 0, its complement at 8.  Every held write up
 * to seq has reached the origin; the committer moves it forward before
 * the writes leave its indexes, so that a later write which was not held
 * is never undone by a replay.
 *
 * Record (64 bytes, slot (seq - 1) % slots of the ring):
 *     0  u32 magic "HWR1"   4  u32 crc32c of the record (own field zero)
 *     8  u64 seq           16  u64 offset on the origin
 *    24  u64 data offset in the file (0: no data: zero, trim)
 *    32  u32 count         36  u32 crc32c of the data
 *    40  u8 op (1 write, 2 zero, 3 trim)   41 u8 flags (1: may trim)
 *    42  u8 dropped (never to be applied: cancelled or lost)
 *    43..63 zero
 * Records are written in sequence order under the write-back lock, so
 * the ring from mark + 1 on is a run of consecutive sequence numbers
 * ended by a slot that does not hold the next one.
 */
#ifndef SNAPFG_HELD_RECORD_H
#define SNAPFG_HELD_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HELD_MAGIC "SNAPFGHW"
#define HELD_VERSION 1
#define HELD_PAGE 4096
#define HELD_HEADER_FIXED 1136
#define HELD_UUID_LEN 40
#define HELD_BOOT_ID_LEN 40
#define HELD_PATH_LEN 1024
#define HELD_RECORD_LEN 64
#define HELD_MARK_LEN HELD_PAGE

enum held_record_op {
  HELD_OP_WRITE = 1,
  HELD_OP_ZERO = 2,
  HELD_OP_TRIM = 3,
};
#define HELD_FLAG_MAY_TRIM 1

struct held_header {
  uint64_t created;
  uint32_t pid;
  char boot_id[HELD_BOOT_ID_LEN];
  uint64_t origin_dev, origin_ino, origin_size;
  char origin_path[HELD_PATH_LEN];
  uint32_t slots;
  uint32_t max_stores;
  uint32_t nstores;
  char (*stores)[HELD_UUID_LEN];  /* nstores of them */
};

/* Where each part of a file with these parameters starts. */
struct held_layout {
  uint64_t header_len;            /* whole pages */
  uint64_t mark_off;
  uint64_t ring_off;
  uint64_t data_off;              /* whole MiB */
};
extern void held_layout_of (uint32_t slots, uint32_t max_stores,
                            struct held_layout *l);

/* Encode h into buf (header_len bytes, zeroed first). */
extern void held_header_encode (const struct held_header *h,
                                const struct held_layout *l, void *buf);
/* Decode and check buf (len bytes, at least HELD_HEADER_FIXED).  Returns
 * NULL, or what is wrong (static text).  On success h->stores points
 * into buf.
 */
extern const char *held_header_decode (const void *buf, size_t len,
                                       struct held_header *h,
                                       struct held_layout *l);

/* The applied mark. */
extern void held_mark_encode (uint64_t seq, void *buf);
extern const char *held_mark_decode (const void *buf, uint64_t *seq);

struct held_record {
  uint64_t seq;
  uint64_t offset;
  uint64_t data_off;
  uint32_t count;
  uint32_t data_crc;
  uint8_t op;                     /* enum held_record_op */
  uint8_t flags;
  bool dropped;
};

extern void held_record_encode (const struct held_record *r, void *buf);
/* Returns NULL, or what is wrong: an all-zero slot is "empty". */
extern const char *held_record_decode (const void *buf,
                                       struct held_record *r);
extern bool held_record_slot_empty (const void *buf);

/* The records to replay, in sequence order. */
struct held_replay {
  struct held_record *r;
  size_t n;
  bool torn;                      /* the last slot written was torn */
  uint64_t torn_seq;
};

/* Walk the ring (slots records at ring) from the record after mark:
 * the records to replay, in order, into *out (malloc'd array).  A last
 * record that fails its checksum ends the walk (it was being written
 * when the process died: never acknowledged).  Anything else wrong (a
 * bad record followed by a good one, a sequence number out of place, a
 * record whose data lies outside [data_off, file_size), a length over
 * max_count) is refused: returns -EINVAL with what is wrong in why.
 * Returns 0, -EINVAL or -ENOMEM.
 */
extern int held_records_scan (const void *ring, uint32_t slots,
                              uint64_t mark, uint64_t data_off,
                              uint64_t file_size, uint32_t max_count,
                              struct held_replay *out,
                              char *why, size_t whylen);

#endif
