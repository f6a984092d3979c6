/* snapfg: a per-CPU reader/writer lock.
 *
 * Every request takes the read side once, to read the geometry (block
 * size, chunk sizes, the snapshot list, validity) without it changing
 * underneath.  Changing the geometry takes the write side, which waits for
 * the requests in flight to finish.
 *
 * Readers only touch a counter in their own CPU's slot (padded to a cache
 * line), so concurrent readers on different CPUs never bounce a shared
 * line.  The writer raises a flag and waits until the sum of all slots is
 * zero.  The counters and the flag are sequentially consistent, so either
 * the reader sees the flag or the writer sees the reader's count (never
 * neither).  A reader that meets a writer backs out and sleeps on a
 * condition variable until the writer is done; nobody spins.
 *
 * A reader may unlock on a different CPU from the one it locked on: the
 * lock returns the slot it counted in, and unlock takes that slot.
 */
#ifndef SNAPFG_PERCPU_RWLOCK_H
#define SNAPFG_PERCPU_RWLOCK_H

#include <pthread.h>
#include <stdatomic.h>

#include "cachealign.h"

struct percpu_rwlock_slot {
  atomic_long readers;
} SNAPFG_CACHE_ALIGNED;

struct percpu_rwlock {
  struct percpu_rwlock_slot *slots;
  unsigned slot_mask;             /* number of slots - 1 (a power of two) */

  /* The writer's state: on its own cache line so the readers' fast path
   * (which only loads 'writer') shares it read-only.
   */
  atomic_int writer SNAPFG_CACHE_ALIGNED;
  pthread_mutex_t mutex;          /* protects the sleeping below */
  pthread_cond_t readers_gone;    /* a writer waits here for readers to drain */
  pthread_cond_t writer_gone;     /* readers and writers wait for the writer */
};

/* The token a reader passes back to unlock. */
typedef unsigned percpu_rwlock_token;

extern int percpu_rwlock_init (struct percpu_rwlock *lock);
extern void percpu_rwlock_destroy (struct percpu_rwlock *lock);

extern percpu_rwlock_token percpu_rwlock_read_lock (struct percpu_rwlock *lock);
extern void percpu_rwlock_read_unlock (struct percpu_rwlock *lock,
                                       percpu_rwlock_token token);

extern void percpu_rwlock_write_lock (struct percpu_rwlock *lock);
extern void percpu_rwlock_write_unlock (struct percpu_rwlock *lock);

#endif
