/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: a per-CPU (per-thread) reader/writer lock (see percpu-rwlock.h). */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/membarrier.h>

#include "percpu-rwlock.h"
#include "scoped-lock.h"
#include "snapfg-log.h"
#include "vector.h"

#if defined(__SANITIZE_THREAD__)
# define FORCE_FENCES 1
#elif defined(__has_feature)
# if __has_feature(thread_sanitizer)
#  define FORCE_FENCES 1
# endif
#endif
#ifndef FORCE_FENCES
# define FORCE_FENCES 0
#endif

/* --- slots: one per (thread, lock), found through a per-thread cache --- */

#define THREAD_CACHE 4

struct cached_slot {
  uint64_t lock_id;
  struct percpu_rwlock_slot *slot;
};

/* initial-exec: no __tls_get_addr call on the fast path (the plugin is a
 * dlopened library, where the default model would need one). */
#define TLS_FAST __attribute__ ((tls_model ("initial-exec")))
static _Thread_local struct cached_slot thread_cache[THREAD_CACHE] TLS_FAST;
/* The last lock this thread used: almost always the one it uses next. */
static _Thread_local struct cached_slot thread_last TLS_FAST;

/* Locks alive, so that a thread exiting after a lock was destroyed does
 * not touch freed memory when it gives its slots back.
 */
DEFINE_VECTOR_TYPE (lock_vector, struct percpu_rwlock *);
static pthread_mutex_t live_locks_mutex = PTHREAD_MUTEX_INITIALIZER;
static lock_vector live_locks;  /* under live_locks_mutex */
static atomic_uint_least64_t next_lock_id = 1;
/* Its destructor gives a thread's slots back when the thread exits.  It
 * exists only while some lock does: the plugin may be unloaded before
 * nbdkit's last threads exit, and a destructor must not outlive its code.
 */
static pthread_key_t exit_key;
static bool exit_key_created;   /* under live_locks_mutex */

/* Thread exit: give this thread's slots back to their locks. */
static void
release_thread_slots (void *unused)
{
  pthread_mutex_lock (&live_locks_mutex);
  for (int i = 0; i < THREAD_CACHE; ++i) {
    if (thread_cache[i].slot == NULL)
      continue;
    for (size_t j = 0; j < live_locks.len; ++j) {
      if (live_locks.ptr[j]->id == thread_cache[i].lock_id) {
        atomic_store (&thread_cache[i].slot->in_use, false);
        break;
      }
    }
    thread_cache[i].slot = NULL;
    thread_cache[i].lock_id = 0;
  }
  thread_last.lock_id = 0;
  thread_last.slot = NULL;
  pthread_mutex_unlock (&live_locks_mutex);
}

static struct percpu_rwlock_slot *
new_slot (struct percpu_rwlock *lock)
{
  struct percpu_rwlock_slab *slab, *last = NULL;
  struct percpu_rwlock_slot *found = NULL;

  pthread_mutex_lock (&lock->registry);
  for (slab = atomic_load (&lock->slabs); slab && !found;
       slab = atomic_load (&slab->next)) {
    last = slab;
    for (int i = 0; i < PERCPU_RWLOCK_SLAB; ++i) {
      if (!atomic_load (&slab->slot[i].in_use)) {
        found = &slab->slot[i];
        break;
      }
    }
  }
  if (!found) {
    slab = aligned_alloc (SNAPFG_CACHELINE, sizeof *slab);
    if (slab) {
      memset (slab, 0, sizeof *slab);
      /* Published with a release store: a writer summing the slabs
       * without the registry lock sees a fully zeroed slab.
       */
      if (last)
        atomic_store (&last->next, slab);
      else
        atomic_store (&lock->slabs, slab);
      found = &slab->slot[0];
    }
  }
  if (found)
    atomic_store (&found->in_use, true);
  pthread_mutex_unlock (&lock->registry);
  if (found == NULL)
    abort ();                   /* out of memory for 4 KiB: nothing sane to do */
  return found;
}

static struct percpu_rwlock_slot *
thread_slot_slow (struct percpu_rwlock *lock)
{
  int free_entry = -1;

  for (int i = 0; i < THREAD_CACHE; ++i) {
    if (thread_cache[i].lock_id == lock->id)
      return thread_cache[i].slot;
    if (free_entry < 0 && thread_cache[i].slot == NULL)
      free_entry = i;
  }

  /* First use of this lock by this thread (which holds no slot of it). */
  pthread_mutex_lock (&live_locks_mutex);
  if (exit_key_created)
    pthread_setspecific (exit_key, thread_cache);
  pthread_mutex_unlock (&live_locks_mutex);
  if (free_entry < 0) {
    /* Every cache entry is taken (by live locks, or by locks destroyed
     * while this thread kept an entry for them): give back all of this
     * thread's slots, since release_thread_slots empties the whole cache,
     * and start again at entry 0.  That is only safe because the thread
     * holds no read lock of another lock while it takes this one's first:
     * a snapfg process has one such lock (the engine's geometry), so the
     * cache only fills up in tests and benchmarks that make many locks.
     */
    release_thread_slots (NULL);
    free_entry = 0;
  }
  thread_cache[free_entry].lock_id = lock->id;
  thread_cache[free_entry].slot = new_slot (lock);
  return thread_cache[free_entry].slot;
}

static inline struct percpu_rwlock_slot *
thread_slot (struct percpu_rwlock *lock)
{
  if (__builtin_expect (thread_last.lock_id == lock->id, 1))
    return thread_last.slot;
  thread_last.slot = thread_slot_slow (lock);
  thread_last.lock_id = lock->id;
  return thread_last.slot;
}

/* --- the lock --- */

static bool membarrier_ready;
static pthread_once_t membarrier_once = PTHREAD_ONCE_INIT;

static void
register_membarrier (void)
{
  long cmds = syscall (SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);

  if (cmds >= 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
      syscall (SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
               0, 0) == 0)
    membarrier_ready = true;
}

int
percpu_rwlock_init (struct percpu_rwlock *lock)
{
  int err;

  memset (lock, 0, sizeof *lock);
  pthread_once (&membarrier_once, register_membarrier);
  lock->use_fences = FORCE_FENCES || !membarrier_ready;
  lock->id = atomic_fetch_add (&next_lock_id, 1);
  atomic_init (&lock->slabs, NULL);
  atomic_init (&lock->writer, 0);

  err = pthread_mutex_init (&lock->registry, NULL);
  if (err == 0)
    err = pthread_mutex_init (&lock->mutex, NULL);
  if (err == 0)
    err = pthread_cond_init (&lock->readers_gone, NULL);
  if (err == 0)
    err = pthread_cond_init (&lock->writer_gone, NULL);
  if (err)
    return -err;

  SCOPED_MUTEX_LOCK (&live_locks_mutex);
  if (!exit_key_created)
    exit_key_created = pthread_key_create (&exit_key,
                                           release_thread_slots) == 0;
  return lock_vector_append (&live_locks, lock);
}

void
percpu_rwlock_destroy (struct percpu_rwlock *lock)
{
  struct percpu_rwlock_slab *slab, *next;

  pthread_mutex_lock (&live_locks_mutex);
  for (size_t i = 0; i < live_locks.len; ++i) {
    if (live_locks.ptr[i] == lock) {
      live_locks.ptr[i] = live_locks.ptr[--live_locks.len];
      break;
    }
  }
  if (live_locks.len == 0) {
    lock_vector_reset (&live_locks);
    if (exit_key_created) {
      pthread_key_delete (exit_key);
      exit_key_created = false;
    }
  }
  pthread_mutex_unlock (&live_locks_mutex);
  /* This thread's cache entry for the lock, if any, is dead now. */
  for (int i = 0; i < THREAD_CACHE; ++i)
    if (thread_cache[i].lock_id == lock->id)
      thread_cache[i].lock_id = 0, thread_cache[i].slot = NULL;
  if (thread_last.lock_id == lock->id)
    thread_last.lock_id = 0, thread_last.slot = NULL;

  for (slab = atomic_load (&lock->slabs); slab; slab = next) {
    next = atomic_load (&slab->next);
    free (slab);
  }
  pthread_cond_destroy (&lock->writer_gone);
  pthread_cond_destroy (&lock->readers_gone);
  pthread_mutex_destroy (&lock->mutex);
  pthread_mutex_destroy (&lock->registry);
}

/* Make every reader's count visible to us, or our flag visible to every
 * reader that counts itself in from now on.
 */
static void
heavy_barrier (struct percpu_rwlock *lock)
{
  if (!lock->use_fences)
    syscall (SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
  else
    atomic_thread_fence (memory_order_seq_cst);
}

static long
sum_readers (struct percpu_rwlock *lock)
{
  long sum = 0;

  for (struct percpu_rwlock_slab *slab = atomic_load (&lock->slabs); slab;
       slab = atomic_load (&slab->next))
    for (int i = 0; i < PERCPU_RWLOCK_SLAB; ++i)
      sum += atomic_load (&slab->slot[i].readers);
  return sum;
}

/* The reader's side of the barrier pairing: free (a compiler barrier)
 * with membarrier, a real fence otherwise.
 */
static inline void
light_barrier (const struct percpu_rwlock *lock)
{
  if (lock->use_fences)
    atomic_thread_fence (memory_order_seq_cst);
  else
    atomic_signal_fence (memory_order_seq_cst);
}

static inline void
slot_add (const struct percpu_rwlock *lock, struct percpu_rwlock_slot *slot,
          long delta)
{
  if (lock->use_fences)
    atomic_fetch_add (&slot->readers, delta);
  else {
    /* Only this thread writes its slot: no read-modify-write needed. */
    long n = atomic_load_explicit (&slot->readers, memory_order_relaxed);
    atomic_store_explicit (&slot->readers, n + delta, memory_order_release);
  }
}

void
percpu_rwlock_read_unlock (struct percpu_rwlock *lock,
                           percpu_rwlock_token slot)
{
  slot_add (lock, slot, -1);
  light_barrier (lock);

  /* If a writer is waiting for the readers to drain, wake it.  Taking the
   * mutex orders this wakeup after the writer's check of the counters, so
   * it cannot be lost.
   */
  if (atomic_load_explicit (&lock->writer, memory_order_relaxed) != 0) {
    pthread_mutex_lock (&lock->mutex);
    pthread_cond_broadcast (&lock->readers_gone);
    pthread_mutex_unlock (&lock->mutex);
  }
}

percpu_rwlock_token
percpu_rwlock_read_lock (struct percpu_rwlock *lock)
{
  struct percpu_rwlock_slot *slot = thread_slot (lock);

  for (;;) {
    /* Fast path: count ourselves in, then look for a writer. */
    slot_add (lock, slot, 1);
    light_barrier (lock);
    if (atomic_load_explicit (&lock->writer, memory_order_acquire) == 0)
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
percpu_rwlock_write_lock (struct percpu_rwlock *lock)
{
  pthread_mutex_lock (&lock->mutex);
  while (atomic_load (&lock->writer) != 0)
    pthread_cond_wait (&lock->writer_gone, &lock->mutex);
  atomic_store (&lock->writer, 1);
  heavy_barrier (lock);

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
