/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: the held file (held-file.c), where held writes
 * outlive a crash of the process.
 *
 * A named file on a memory file system (tmpfs: /run, $XDG_RUNTIME_DIR,
 * systemd's $RUNTIME_DIRECTORY), one per origin, laid out as
 * held-record.h says: a header that binds it to the origin, its stores
 * and the boot; the applied mark; a ring of records, one per held
 * write, written in sequence order; and the held data, never mapped
 * into the process (the kernel copies it in with pwrite and out with
 * pread).  Each piece of data gets whole pages of its own at an offset
 * never handed out again, and its pages are given back (a hole punched)
 * when it is released.  The header, the mark and the ring are mapped
 * (MAP_SHARED): a record is written with a store into the page cache of
 * the file, which the kernel keeps when the process dies.
 */
#ifndef SNAPFG_HELD_FILE_H
#define SNAPFG_HELD_FILE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "held-record.h"

struct held_file {
  int fd;                         /* -1: none */
  int dirfd;
  char *dir;                      /* for messages */
  char *name;
  char *path;                     /* dir/name, for messages */
  struct held_layout layout;
  uint32_t slots;
  uint32_t max_stores;
  unsigned char *map;             /* [0, ring_off + slots * 64) */
  size_t map_len;
  atomic_uint_least64_t next;     /* the next free data offset (bump) */
  uint64_t punched_seq;           /* records up to it given back */
};

/* Where held files go, and whether a directory on disk is allowed. */
struct held_place {
  const char *dir;                /* held-dir=, or NULL: the default */
  bool on_disk;                   /* held-dir-on-disk=true */
};

/* What a held file is bound to. */
struct held_binding {
  const char *origin_path;
  uint64_t origin_dev, origin_ino, origin_size;
  bool has_identity;              /* dev/ino mean something */
  bool origin_moved;              /* origin-moved=true */
  uint32_t max_stores;            /* max-snapshots= */
};

/* Find the held directory (held-dir=, else $RUNTIME_DIRECTORY, else
 * $XDG_RUNTIME_DIR, else /run/snapfg, else /dev/shm/snapfg-UID), check
 * it (owner, mode, a memory file system unless on_disk) and open it into
 * hf (fd -1, no file yet).  The file's name follows from the origin's
 * path.  Returns 0 or -errno (logged, naming the directory).
 */
extern int held_file_place (struct held_file *hf,
                            const struct held_place *place,
                            const struct held_binding *b);

/* Is there a held file for this origin in the directory?  1 yes, 0 no,
 * -errno (logged).
 */
extern int held_file_exists (struct held_file *hf);

/* Open the existing held file for a replay: its type, owner and mode,
 * header, boot and origin checked, its ring walked (held-record.h).
 * Returns 0 with the records to replay in *rp (the file is open and
 * mapped); 1 if the file is whole and holds no write to replay (its
 * boot and origin are not checked then: nothing in it can be lost or
 * misapplied); or -errno with what is wrong logged, naming the file
 * and what to do.  Writes nothing.
 */
extern int held_file_open_existing (struct held_file *hf,
                                    const struct held_binding *b,
                                    struct held_replay *rp,
                                    struct held_header *hdr);

/* Read the data of record r into buf (r->count bytes) and check its
 * checksum.  Returns 0, -EIO if it does not match (logged), or -errno.
 */
extern int held_file_load_record (struct held_file *hf,
                                  const struct held_record *r, void *buf);

/* Create a new, empty held file (exclusively: an existing one is never
 * overwritten) bound to b, with the given stores.  Returns 0 or -errno
 * (logged).
 */
extern int held_file_create (struct held_file *hf,
                             const struct held_binding *b,
                             char (*stores)[HELD_UUID_LEN], uint32_t nstores);

/* Bind the file to a new list of stores (nothing is held: the caller
 * drained it).  -ENOSPC if there are more than max_stores.
 */
extern int held_file_set_stores (struct held_file *hf,
                                 char (*stores)[HELD_UUID_LEN],
                                 uint32_t nstores);

/* Unmap, close; with remove, unlink it first (everything it held was
 * applied).  Leaves hf placed (dirfd open) unless forget.
 */
extern void held_file_close (struct held_file *hf, bool remove);
/* Close the directory too and free the names. */
extern void held_file_forget (struct held_file *hf);

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

/* The ring has room for a record of seq while seq - applied < slots. */
extern bool held_file_ring_has_room (const struct held_file *hf,
                                     uint64_t seq, uint64_t applied);
/* Write r's record into its slot (under the write-back lock: records go
 * in in sequence order).
 */
extern void held_file_write_record (struct held_file *hf,
                                    const struct held_record *r);
/* Mark a written record dropped: it is never to be applied. */
extern void held_file_drop_record (struct held_file *hf, uint64_t seq);
/* Every held write up to seq has reached the origin; give back the
 * record pages before it.
 */
extern void held_file_mark_applied (struct held_file *hf, uint64_t seq);

#endif
