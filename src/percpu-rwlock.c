/* snapfg: a per-CPU reader/writer lock (see percpu-rwlock.h). */

#include <config.h>

#include <stdlib.h>
#include <errno.h>
#include <sched.h>
#include <unistd.h>
#include <sys/sysinfo.h>

#include "percpu-rwlock.h"
#include "snapfg-log.h"

int
percpu_rwlock_init (struct percpu_rwlock *lock)
{
  unsigned ncpus = get_nprocs_conf ();
  unsigned nslots = 1;
  int err;

  /* One slot per possible CPU, rounded up to a power of two so the slot
   * can be picked with a mask.  At least two so that a failing
   * sched_getcpu() still spreads threads out.
   */
  while (nslots < ncpus || nslots < 2)
    nslots <<= 1;

  lock->slots = aligned_alloc (SNAPFG_CACHELINE,
                               nslots * sizeof (struct percpu_rwlock_slot));
  if (lock->slots == NULL)
    return -ENOMEM;
  for (unsigned i = 0; i < nslots; ++i)
    atomic_init (&lock->slots[i].readers, 0);
  lock->slot_mask = nslots - 1;
  atomic_init (&lock->writer, 0);

  err = pthread_mutex_init (&lock->mutex, NULL);
  if (err == 0)
    err = pthread_cond_init (&lock->readers_gone, NULL);
  if (err == 0)
    err = pthread_cond_init (&lock->writer_gone, NULL);
  if (err) {
    free (lock->slots);
    return -err;
  }
  return 0;
}

void
percpu_rwlock_destroy (struct percpu_rwlock *lock)
{
  pthread_cond_destroy (&lock->writer_gone);
  pthread_cond_destroy (&lock->readers_gone);
  pthread_mutex_destroy (&lock->mutex);
  free (lock->slots);
  lock->slots = NULL;
}

/* Which slot this thread counts in.  sched_getcpu() is served from the
 * rseq area / vDSO without a system call on current glibc and Linux.  If it
 * is unavailable, fall back to a slot fixed per thread.
 */
static inline unsigned
current_slot (const struct percpu_rwlock *lock)
{
#ifdef HAVE_SCHED_GETCPU
  int cpu = sched_getcpu ();
  if (cpu >= 0)
    return (unsigned) cpu & lock->slot_mask;
#endif
  static _Thread_local unsigned thread_slot = ~0u;
  static atomic_uint next_slot;
  if (thread_slot == ~0u)
    thread_slot = atomic_fetch_add_explicit (&next_slot, 1,
                                             memory_order_relaxed);
  return thread_slot & lock->slot_mask;
}

static long
sum_readers (const struct percpu_rwlock *lock)
{
  long sum = 0;

  for (unsigned i = 0; i <= lock->slot_mask; ++i)
    sum += atomic_load (&lock->slots[i].readers);
  return sum;
}

percpu_rwlock_token
percpu_rwlock_read_lock (struct percpu_rwlock *lock)
{
  for (;;) {
    unsigned slot = current_slot (lock);

    /* Fast path: count ourselves in, then look for a writer.  Both are
     * seq_cst, pairing with the writer's store of 'writer' followed by its
     * loads of the counters.
     */
    atomic_fetch_add (&lock->slots[slot].readers, 1);
    if (atomic_load (&lock->writer) == 0)
      return slot;

    /* A writer is active or waiting: back out so it can proceed, and
     * sleep until it is done.
     */
    percpu_rwlock_read_unlock (lock, slot);
    pthread_mutex_lock (&lock->mutex);
    while (atomic_load (&lock->writer) != 0)
      pthread_cond_wait (&lock->writer_gone, &lock->mutex);
    pthread_mutex_unlock (&lock->mutex);
  }
}

void
percpu_rwlock_read_unlock (struct percpu_rwlock *lock,
                           percpu_rwlock_token slot)
{
  atomic_fetch_sub (&lock->slots[slot].readers, 1);

  /* If a writer is waiting for the readers to drain, wake it.  Taking the
   * mutex orders this wakeup after the writer's check of the counters, so
   * it cannot be lost.
   */
  if (atomic_load (&lock->writer) != 0) {
    pthread_mutex_lock (&lock->mutex);
    pthread_cond_broadcast (&lock->readers_gone);
    pthread_mutex_unlock (&lock->mutex);
  }
}

void
percpu_rwlock_write_lock (struct percpu_rwlock *lock)
{
  pthread_mutex_lock (&lock->mutex);
  while (atomic_load (&lock->writer) != 0)
    pthread_cond_wait (&lock->writer_gone, &lock->mutex);
  atomic_store (&lock->writer, 1);

  if (snapfg_debug_lock && sum_readers (lock) != 0)
    snapfg_debug ("geometry lock: writer waiting for %ld in-flight readers",
                  sum_readers (lock));
  while (sum_readers (lock) != 0)
    pthread_cond_wait (&lock->readers_gone, &lock->mutex);
  pthread_mutex_unlock (&lock->mutex);
}

void
percpu_rwlock_write_unlock (struct percpu_rwlock *lock)
{
  pthread_mutex_lock (&lock->mutex);
  atomic_store (&lock->writer, 0);
  pthread_cond_broadcast (&lock->writer_gone);
  pthread_mutex_unlock (&lock->mutex);
}
