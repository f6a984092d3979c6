/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: exception stores.
 *
 * A store owns a snapshot's COW device: it allocates chunks in it, makes
 * exceptions durable (or not), and reports usage.  The engine reads and
 * writes chunk data itself at new_chunk * chunk_size, which is the layout
 * of both of dm-snapshot's stores.
 *
 * The store types are listed once, in SNAPFG_STORE_TYPES (store-types.h);
 * see there for what adding one takes.
 */
#ifndef SNAPFG_STORE_H
#define SNAPFG_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdatomic.h>

#include "store-types.h"
#include "device.h"
#include "store-binding.h"

struct snapfg_store;

/* The most chunks a COW store may hold: the engine's exception table
 * keeps a new chunk in 32 bits (exception-table.h), so a store larger
 * than this is refused when it is opened (16 TiB with 4 KiB chunks).
 */
#define SNAPFG_MAX_COW_CHUNKS UINT32_MAX

/* Called for each exception a store already holds when it is opened. */
typedef int (*store_exception_fn) (void *opaque, uint64_t old_chunk,
                                   uint64_t new_chunk);

/* An exception as a store records it. */
struct store_pair {
  uint64_t old_chunk;
  uint64_t new_chunk;
};

struct snapfg_store_ops {
  const char *name;

  /* Pass every exception the store holds to fn (NULL: none can exist). */
  int (*load) (struct snapfg_store *st, store_exception_fn fn, void *opaque);

  /* Take up to 'want' (at least 1) free chunks that follow each other in
   * the COW device: *first, *first + 1, ..., *first + *got - 1.  Fewer
   * than asked when a metadata area or the end of the store is in the
   * way.  -ENOSPC when the store is full.  A copy-out of consecutive
   * origin chunks then writes their copies with one write.
   */
  int (*alloc_run) (struct snapfg_store *st, uint64_t want,
                    uint64_t *first, uint64_t *got);

  /* Make the n exceptions in pairs durable together: on return, after a
   * crash the store reopens with all of them.  Their data is already
   * written.  One call per batch of copy-outs (one wait for the group
   * commit), not one per exception.
   */
  int (*commit) (struct snapfg_store *st, const struct store_pair *pairs,
                 size_t n);

  /* Make every completed write to the store durable. */
  int (*flush) (struct snapfg_store *st);

  /* The snapshot became Invalid: record it where the store can. */
  void (*invalidate) (struct snapfg_store *st);

  /* The snapshot was dropped: mark the store so that it is never
   * attached as valid again (persistent: header valid = 0, binding
   * state "dropped"; durable on return).  NULL: nothing to mark.
   */
  int (*mark_dropped) (struct snapfg_store *st);

  /* dm-style usage, in 512-byte sectors. */
  void (*usage) (const struct snapfg_store *st, uint64_t *allocated,
                 uint64_t *total, uint64_t *metadata);

  /* Merging back into the origin (NULL: this store cannot merge).
   * merge_begin records durably that a merge is in progress (a restart
   * resumes it); merge_last returns up to max of the last exceptions of
   * the table; merge_forget removes the last n durably; merge_end clears
   * the mark.
   */
  int (*merge_begin) (struct snapfg_store *st);
  int (*merge_last) (struct snapfg_store *st, struct store_pair *pairs,
                     size_t max, size_t *n);
  int (*merge_forget) (struct snapfg_store *st, size_t n);
  int (*merge_end) (struct snapfg_store *st);

  /* Release everything.  clean is false when the snapshot is being torn
   * down after an error.
   */
  void (*close) (struct snapfg_store *st, bool clean);
};

struct snapfg_store {
  const struct snapfg_store_ops *ops;
  struct snapfg_device dev;        /* the COW file or block device */
  bool created;                    /* we created dev's file */
  bool opened_invalid;             /* the store says the snapshot is Invalid */
  bool opened_merging;             /* a merge was in progress: resume it */
  /* Its commit waits for the disk (a persistent store with
   * durability=sync).  Write-back holds first writes only for snapshots
   * whose store does: where a commit costs no wait, holding the data
   * would only add a copy.
   */
  bool commit_syncs;
  uint32_t chunk_size;             /* may differ from the one asked for */
  unsigned chunk_shift;
  uint64_t max_chunks;             /* cow-size / chunk_size */
  uint64_t origin_size;            /* bounds the old chunks a store may hold */
  char uuid[37];                   /* the binding's snapshot uuid ("": none) */
  atomic_uint_least64_t next_chunk;  /* bump allocator */
};

/* Parameters for opening a store. */
struct snapfg_store_params {
  const char *type;                /* a name in SNAPFG_STORE_TYPES */
  const char *path;
  uint32_t chunk_size;
  uint64_t cow_size;               /* 0: the default */
  const struct snapfg_device *origin;
  uint64_t origin_size;
  bool unsynced;                   /* durability=flush (persistent stores) */
  /* Who attaches the store, for the binding checks (NULL: none). */
  const struct binding_want *bind;
  bool must_exist;                 /* never create the file */
  /* A store in the catalogue's state directory: created (O_EXCL) or
   * opened as state_leaf in the directory open as state_dirfd, never
   * through a symbolic link, and only if it is the server user's own.
   * NULL: path is opened as given.
   */
  const char *state_leaf;
  int state_dirfd;
};

/* Open (or create) the store at params->path.  Logs an error naming the
 * file and the problem, and returns a negative errno, on failure.
 */
extern int store_open (const struct snapfg_store_params *params,
                       struct snapfg_store **stp);

/* --- the store types (the table is SNAPFG_STORE_TYPES, store-types.h) --- */

struct store_type {
  const char *name;
  int (*open) (const struct snapfg_store_params *params,
               struct snapfg_store **stp);
  bool survives_restart;           /* its exceptions are on disk */
  const char *summary;
};

#define STORE_TYPE_DECLARE_(name, open, survives, summary)               \
  extern int open (const struct snapfg_store_params *params,             \
                   struct snapfg_store **stp);
SNAPFG_STORE_TYPES (STORE_TYPE_DECLARE_)
#undef STORE_TYPE_DECLARE_

/* Every type, in SNAPFG_STORE_TYPES order; NULL name at the end. */
extern const struct store_type store_types[];

/* The type called name, or NULL. */
extern const struct store_type *store_type_find (const char *name);

static inline uint64_t
store_chunk_offset (const struct snapfg_store *st, uint64_t new_chunk)
{
  return new_chunk << st->chunk_shift;
}

/* Shared by stores: take up to want chunks from the bump pointer. */
extern int store_bump_alloc (struct snapfg_store *st, uint64_t want,
                             uint64_t *first, uint64_t *got);

/* Shared by stores: open or create the COW device named by params,
 * refusing the origin itself.  On error, says why and returns -errno.
 */
extern int store_open_device (const struct snapfg_store_params *params,
                              struct snapfg_store *st);
/* Undo store_open_device after a later error: remove the file only if we
 * created it, leave anything else exactly as it was, free st.
 */
extern void store_discard_new (struct snapfg_store *st);

/* Shared by stores: set max_chunks from cow-size= or the store's default
 * (a block device: its size).  Says why and returns -EINVAL if it is
 * unusable.
 */
extern int store_set_size (const struct snapfg_store_params *params,
                           struct snapfg_store *st, uint64_t default_size);

#endif
