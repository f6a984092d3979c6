/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: a per-CPU (per-thread) reader/writer lock.
 *
 * Every request takes the read side once, to read the geometry (block
 * size, chunk sizes, the snapshot list, validity) without it changing
 * underneath.  Changing the geometry takes the write side, which waits for
 * the requests in flight to finish.
 *
 * Readers count themselves in a slot of their own (one per thread, padded
 * to a cache line), so concurrent readers never write to a shared cache
 * line.  The writer raises a flag and waits until the sum of all slots is
 * zero; a reader that finds the flag raised backs out and sleeps on a
 * condition variable until the writer is done.  Nobody spins.
 *
 * Either the reader sees the flag or the writer sees the reader's count,
 * never neither.  On Linux that is guaranteed without any atomic
 * read-modify-write or fence in the reader: the writer issues
 * membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) after raising the flag,
 * which runs a full memory barrier on every CPU running one of our
 * threads (the user-space analogue of the kernel's RCU-based per-CPU
 * rwsem; docs/design.md section 4).  Where membarrier is not
 * available, and in ThreadSanitizer builds (TSan does not model it),
 * readers use sequentially consistent atomics instead.
 *
 * A slot belongs to one thread, so a read lock must be released by the
 * thread that took it (on any CPU: migration does not matter).
 */
#ifndef SNAPFG_PERCPU_RWLOCK_H
#define SNAPFG_PERCPU_RWLOCK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cachealign.h"
#include "scoped-lock.h"

#define PERCPU_RWLOCK_SLAB 64

struct percpu_rwlock_slot {
  atomic_long readers;          /* written only by the owning thread */
  atomic_bool in_use;           /* owned by a live thread */
} SNAPFG_CACHE_ALIGNED;

struct percpu_rwlock_slab {
  struct percpu_rwlock_slot slot[PERCPU_RWLOCK_SLAB];
  struct percpu_rwlock_slab *_Atomic next;
};

struct percpu_rwlock {
  uint64_t id;                  /* unique, for the threads' slot caches */
  struct percpu_rwlock_slab *_Atomic slabs;
  pthread_mutex_t registry;     /* slot allocation */
  bool use_fences;              /* no membarrier: readers use seq_cst */

  /* The writer's state: on its own cache line, which readers only load. */
  atomic_int writer SNAPFG_CACHE_ALIGNED;
  pthread_mutex_t mutex;          /* protects the sleeping below */
  pthread_cond_t readers_gone;    /* a writer waits here for readers to drain */
  pthread_cond_t writer_gone;     /* readers and writers wait for the writer */
};

/* The token a reader passes back to unlock: its slot. */
typedef struct percpu_rwlock_slot *percpu_rwlock_token;

extern int percpu_rwlock_init (struct percpu_rwlock *lock);
extern void percpu_rwlock_destroy (struct percpu_rwlock *lock);

extern percpu_rwlock_token percpu_rwlock_read_lock (struct percpu_rwlock *lock);
extern void percpu_rwlock_read_unlock (struct percpu_rwlock *lock,
                                       percpu_rwlock_token token);

extern void percpu_rwlock_write_lock (struct percpu_rwlock *lock);
extern void percpu_rwlock_write_unlock (struct percpu_rwlock *lock);

/* --- held for the rest of the current scope (see scoped-lock.h) ---
 *
 *   SCOPED_GEOMETRY_READ_LOCK (&e->geometry);    the read side
 *   SCOPED_GEOMETRY_WRITE_LOCK (&e->geometry);   the write side
 */

struct scoped_read_lock_ {
  struct percpu_rwlock *lock;
  percpu_rwlock_token token;
};

static inline struct scoped_read_lock_
scoped_read_lock_ (struct percpu_rwlock *lock)
{
  struct scoped_read_lock_ held = {
    .lock = lock,
    .token = percpu_rwlock_read_lock (lock),
  };
  return held;
}

static inline void
scoped_read_unlock_ (struct scoped_read_lock_ *held)
{
  percpu_rwlock_read_unlock (held->lock, held->token);
}

#define SCOPED_GEOMETRY_READ_LOCK(lock)                                 \
  struct scoped_read_lock_ SCOPED_LOCK_NAME (scoped_read_)              \
    __attribute__ ((cleanup (scoped_read_unlock_), unused))             \
    = scoped_read_lock_ (lock)

static inline struct percpu_rwlock *
scoped_write_lock_ (struct percpu_rwlock *lock)
{
  percpu_rwlock_write_lock (lock);
  return lock;
}

static inline void
scoped_write_unlock_ (struct percpu_rwlock **lock)
{
  percpu_rwlock_write_unlock (*lock);
}

#define SCOPED_GEOMETRY_WRITE_LOCK(lock)                                \
  struct percpu_rwlock *SCOPED_LOCK_NAME (scoped_write_)                \
    __attribute__ ((cleanup (scoped_write_unlock_), unused))            \
    = scoped_write_lock_ (lock)

#endif
