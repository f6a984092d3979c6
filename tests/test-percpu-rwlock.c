/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of the per-CPU reader/writer lock (src/percpu-rwlock.c):
 *  1. many readers and writers: readers never see a half-done write, and
 *     the data the lock protects is plain (so ThreadSanitizer checks the
 *     lock's ordering too);
 *  2. a reader that unlocks on a different CPU from the one it locked on
 *     gives back exactly the count it took, in the slot it took it in
 *     (each slot is inspected: a wrong slot would leave the sum at zero,
 *     so a writer getting in proves nothing by itself);
 *  3. a writer arriving while readers hold the lock waits for them, and
 *     readers arriving while a writer waits queue behind it.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#include <time.h>

#include "percpu-rwlock.h"
#include "unit-test.h"


static struct percpu_rwlock lock;

/* Protected by 'lock': a writer keeps a == b == c when it unlocks. */
static long a, b, c;
static atomic_bool stop;
static atomic_long reads_done, writes_done;

static void *
reader (void *arg)
{
  long n = 0;

  while (!atomic_load (&stop)) {
    percpu_rwlock_token t = percpu_rwlock_read_lock (&lock);
    long x = a, y = b, z = c;
    percpu_rwlock_read_unlock (&lock, t);
    if (x != y || y != z)
      FAIL ("reader saw a torn write: %ld %ld %ld", x, y, z);
    n++;
  }
  atomic_fetch_add (&reads_done, n);
  return NULL;
}

static void *
writer (void *arg)
{
  long n = 0;

  while (!atomic_load (&stop)) {
    percpu_rwlock_write_lock (&lock);
    a++;
    sched_yield ();             /* let readers try to slip in */
    b++;
    c++;
    percpu_rwlock_write_unlock (&lock);
    n++;
    usleep (100);
  }
  atomic_fetch_add (&writes_done, n);
  return NULL;
}

static void
test_readers_and_writers (void)
{
  enum { READERS = 8, WRITERS = 2 };
  pthread_t r[READERS], w[WRITERS];

  atomic_store (&stop, false);
  for (int i = 0; i < READERS; ++i)
    pthread_create (&r[i], NULL, reader, NULL);
  for (int i = 0; i < WRITERS; ++i)
    pthread_create (&w[i], NULL, writer, NULL);
  sleep (2);
  atomic_store (&stop, true);
  for (int i = 0; i < READERS; ++i)
    pthread_join (r[i], NULL);
  for (int i = 0; i < WRITERS; ++i)
    pthread_join (w[i], NULL);
  if (a != b || b != c || a != atomic_load (&writes_done))
    FAIL ("lost writes: a=%ld b=%ld c=%ld writes=%ld", a, b, c,
          atomic_load (&writes_done));
  if (atomic_load (&reads_done) == 0 || atomic_load (&writes_done) == 0)
    FAIL ("no progress: %ld reads, %ld writes",
          atomic_load (&reads_done), atomic_load (&writes_done));
  printf ("readers+writers: %ld reads, %ld writes, consistent\n",
          atomic_load (&reads_done), atomic_load (&writes_done));
}

static bool
pin_to_cpu (int cpu)
{
  cpu_set_t set;

  CPU_ZERO (&set);
  CPU_SET (cpu, &set);
  return sched_setaffinity (0, sizeof set, &set) == 0;
}

static atomic_bool writer_has_lock;

static void *
writer_once (void *arg)
{
  percpu_rwlock_write_lock (&lock);
  atomic_store (&writer_has_lock, true);
  usleep (200 * 1000);          /* hold it while readers queue up */
  /* Cleared before unlocking: a reader may get in right after. */
  atomic_store (&writer_has_lock, false);
  percpu_rwlock_write_unlock (&lock);
  return NULL;
}

/* Wait up to 5 s for a flag to become true. */
static bool
wait_for (atomic_bool *flag)
{
  for (int i = 0; i < 5000; ++i) {
    if (atomic_load (flag))
      return true;
    usleep (1000);
  }
  return false;
}

/* Check every reader slot of the lock: 'held' (if not NULL) must count
 * exactly one reader and every other slot none.
 */
static void
check_slots (const char *when, percpu_rwlock_token held)
{
  int slots = 0;

  for (struct percpu_rwlock_slab *slab = atomic_load (&lock.slabs); slab;
       slab = atomic_load (&slab->next))
    for (int i = 0; i < PERCPU_RWLOCK_SLAB; ++i) {
      struct percpu_rwlock_slot *slot = &slab->slot[i];
      long want = slot == held ? 1 : 0;
      long n = atomic_load (&slot->readers);

      if (n != want)
        FAIL ("%s: slot %d counts %ld readers, expected %ld", when, slots,
              n, want);
      slots++;
    }
  if (slots == 0)
    FAIL ("%s: the lock has no reader slots", when);
}

static void
test_unlock_on_other_cpu (void)
{
  long ncpus = sysconf (_SC_NPROCESSORS_ONLN);
  pthread_t w;
  percpu_rwlock_token t;

  if (ncpus < 2 || !pin_to_cpu (0)) {
    printf ("unlock on another CPU: skipped (one CPU)\n");
    return;
  }
  if (sched_getcpu () != 0)
    FAIL ("not running on CPU 0 after pinning");
  t = percpu_rwlock_read_lock (&lock);
  check_slots ("read lock taken on CPU 0", t);
  if (!pin_to_cpu (1))
    FAIL ("sched_setaffinity to CPU 1");
  if (sched_getcpu () != 1)
    FAIL ("not running on CPU 1 after pinning");
  percpu_rwlock_read_unlock (&lock, t);
  /* The unlock on CPU 1 must have undone the lock's count in its own
   * slot, not touched one belonging to CPU 1 or to another thread.
   */
  check_slots ("read lock released on CPU 1", NULL);

  /* And the lock works on: a writer gets in. */
  atomic_store (&writer_has_lock, false);
  pthread_create (&w, NULL, writer_once, NULL);
  if (!wait_for (&writer_has_lock))
    FAIL ("writer could not take the lock after a cross-CPU unlock");
  pthread_join (w, NULL);

  cpu_set_t all;
  CPU_ZERO (&all);
  for (int i = 0; i < ncpus; ++i)
    CPU_SET (i, &all);
  sched_setaffinity (0, sizeof all, &all);
  printf ("unlock on another CPU: ok\n");
}

static atomic_bool late_reader_in;

static void *
late_reader (void *arg)
{
  percpu_rwlock_token t = percpu_rwlock_read_lock (&lock);
  /* The writer queued before us, so it must have run and finished. */
  if (atomic_load (&writer_has_lock))
    FAIL ("a reader got in while the writer held the lock");
  atomic_store (&late_reader_in, true);
  percpu_rwlock_read_unlock (&lock, t);
  return NULL;
}

static void
test_writer_waits_for_readers (void)
{
  percpu_rwlock_token t1, t2;
  pthread_t w, r;

  /* Two readers (this thread, twice) hold the lock. */
  t1 = percpu_rwlock_read_lock (&lock);
  t2 = percpu_rwlock_read_lock (&lock);
  atomic_store (&writer_has_lock, false);
  pthread_create (&w, NULL, writer_once, NULL);
  /* Until the writer is waiting: on a loaded machine its thread may not
   * run for a while, and a reader arriving before it rightly gets in.
   */
  for (int i = 0; i < 5000 && atomic_load (&lock.writer) == 0; ++i)
    usleep (1000);
  if (atomic_load (&lock.writer) == 0)
    FAIL ("the writer did not start waiting within 5 s");
  usleep (100 * 1000);
  if (atomic_load (&writer_has_lock))
    FAIL ("the writer got the lock while readers held it");

  /* A reader arriving now queues behind the waiting writer. */
  atomic_store (&late_reader_in, false);
  pthread_create (&r, NULL, late_reader, NULL);
  usleep (100 * 1000);
  if (atomic_load (&late_reader_in))
    FAIL ("a new reader overtook a waiting writer");

  percpu_rwlock_read_unlock (&lock, t1);
  usleep (50 * 1000);
  if (atomic_load (&writer_has_lock))
    FAIL ("the writer got the lock while one reader still held it");
  percpu_rwlock_read_unlock (&lock, t2);
  if (!wait_for (&writer_has_lock) && !atomic_load (&late_reader_in))
    FAIL ("the writer never got the lock after the readers left");
  pthread_join (w, NULL);
  pthread_join (r, NULL);
  if (!atomic_load (&late_reader_in))
    FAIL ("the queued reader never got in");
  printf ("writer waits for readers, readers queue behind writer: ok\n");
}

int
main (void)
{
  if (percpu_rwlock_init (&lock) < 0)
    FAIL ("percpu_rwlock_init");
  test_readers_and_writers ();
  test_unlock_on_other_cpu ();
  test_writer_waits_for_readers ();
  percpu_rwlock_destroy (&lock);
  return EXIT_SUCCESS;
}
