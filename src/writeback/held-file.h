/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the memory file that holds write-back's data (held-file.c).
 *
 * Held data lives in an anonymous memory file (memfd), never mapped into
 * the process: the kernel copies it in (pwrite) and out (pread).  Each
 * piece gets whole pages of its own at an offset that is never handed
 * out again, and its pages are given back (a hole punched) when it is
 * released.
 */
#ifndef SNAPFG_HELD_FILE_H
#define SNAPFG_HELD_FILE_H

#include <stdint.h>
#include <stdatomic.h>

struct held_file {
  int fd;
  atomic_uint_least64_t next;     /* the next free offset (bump) */
};

/* Create it (fd -1 until then).  Returns 0 or -errno. */
extern int held_file_open (struct held_file *hf);
extern void held_file_close (struct held_file *hf);

/* The bytes of the file count bytes take: whole pages. */
extern uint64_t held_file_extent (uint32_t count);

/* Copy count bytes (count > 0) into new pages; *off is where they are.
 * Returns 0 or -errno (nothing is kept then).
 */
extern int held_file_store (struct held_file *hf, const void *buf,
                            uint32_t count, uint64_t *off);
/* Copy count bytes at off back out.  Returns 0 or -errno. */
extern int held_file_load (struct held_file *hf, void *buf, size_t count,
                           uint64_t off);
/* Give the pages of [off, off+len) back (len from held_file_extent, or
 * the sum of neighbouring extents).
 */
extern void held_file_release (struct held_file *hf, uint64_t off,
                               uint64_t len);

#endif
