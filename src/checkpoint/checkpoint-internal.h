/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the checkpoint chain's internals, shared by its files:
 *
 *   checkpoint.c          the chain: reopening it from the catalogue,
 *                         closing it, recording it, the engine's hooks
 *   checkpoint-create.c   creating and dropping checkpoints
 *   checkpoint-query.c    checkpoint list and changed --since
 *
 * Not for the rest of snapfg, which uses checkpoint.h.
 */
#ifndef SNAPFG_CHECKPOINT_INTERNAL_H
#define SNAPFG_CHECKPOINT_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

#include "cbt-bitmap.h"
#include "catalogue.h"
#include "vector.h"

struct snapfg_engine;

struct checkpoint;
DEFINE_VECTOR_TYPE (checkpoint_vector, struct checkpoint *);

struct checkpoint {
  char *name;
  char *bitmap_path;
  char *snapshot;               /* created with this snapshot, or NULL */
  char *owner;                  /* who made it (a backup directory), or NULL */
  uint64_t seq;
  int64_t created;
  uint32_t granularity;
  struct cbt_bitmap *bm;        /* NULL: the bitmap could not be opened */
  bool lost;                    /* inconsistent whatever the bitmap says */
  struct checkpoint *frozen;    /* prepared: the one its commit froze */
};

struct checkpoint_chain {
  struct catalogue *cat;        /* NULL: no state=, no checkpoints */
  uint32_t granularity;         /* for new checkpoints */
  pthread_mutex_t lock;         /* commands; the list */
  pthread_mutex_t io_lock;      /* see checkpoint.h */
  checkpoint_vector list;       /* creation order: the last is active */
  uint64_t next_seq;
  /* A bitmap became inconsistent at run time and the catalogue does not
   * say so yet (it is written at the next command or at close).
   */
  atomic_bool unrecorded;
};

static inline bool
is_inconsistent (const struct checkpoint *cp)
{
  return cp->lost || cp->bm == NULL || atomic_load (&cp->bm->inconsistent);
}

/* The state the catalogue and "checkpoint list" give list[i]. */
extern const char *checkpoint_state_of (const struct checkpoint_chain *c,
                                        size_t i);
/* Free a checkpoint (its bitmap closed, not removed).  NULL is fine. */
extern void checkpoint_free (struct checkpoint *cp);
/* The bitmaps' on_inconsistent hook (opaque: the chain). */
extern void checkpoint_note_inconsistent (struct cbt_bitmap *bm,
                                          void *opaque);
/* Rewrite the catalogue's checkpoint list as list[0..n) (the chain as it
 * is or is about to be), in one atomic rewrite.
 */
extern int checkpoint_records_write (struct checkpoint_chain *c,
                                     struct checkpoint **list, size_t n);
/* The binding a bitmap of checkpoint NAME (sequence number SEQ) of this
 * chain must carry: the catalogue, the checkpoint, the origin's identity
 * (and whether origin-moved=true vouches for another).
 */
extern void checkpoint_binding (struct snapfg_engine *e, const char *name,
                                uint64_t seq, struct cbt_binding *b);
/* Record a run-time inconsistency that the catalogue does not hold yet. */
extern void checkpoint_record_pending (struct checkpoint_chain *c);
/* The index of checkpoint NAME, or -1.  Called with c->lock held. */
extern ssize_t checkpoint_find_locked (struct checkpoint_chain *c,
                                       const char *name);
/* 0 if the chain has a catalogue, else -ENOTSUP after saying WHAT needs
 * state=FILE.  C may be NULL.
 */
extern int checkpoint_need_catalogue (struct checkpoint_chain *c,
                                      const char *what);

#endif
