/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of common/scoped-lock.h and the SCOPED_GEOMETRY_* locks of
 * common/percpu-rwlock.h: each scoped lock is held from its
 * macro to the end of the scope and released on every way out (end of
 * block, return, break), two in one scope are both released, and the
 * geometry read lock really holds the read side (a writer waits for it)
 * and its write side really excludes readers.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "percpu-rwlock.h"
#include "scoped-lock.h"
#include "unit-test.h"

static pthread_mutex_t m1 = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t m2 = PTHREAD_MUTEX_INITIALIZER;
static struct percpu_rwlock geometry;

/* Is m free?  (trylock from another thread: a mutex held by this thread
 * would answer EBUSY here too, but the check must not depend on that.)
 */
static void *
try_mutex (void *m)
{
  int r = pthread_mutex_trylock (m);

  if (r == 0)
    pthread_mutex_unlock (m);
  return (void *) (intptr_t) r;
}

static bool
mutex_is_free (pthread_mutex_t *m)
{
  pthread_t t;
  void *r;

  pthread_create (&t, NULL, try_mutex, m);
  pthread_join (t, &r);
  return r == 0;
}

static int
locked_return (bool early)
{
  SCOPED_MUTEX_LOCK (&m1);
  SCOPED_MUTEX_LOCK (&m2);

  CHECK (!mutex_is_free (&m1) && !mutex_is_free (&m2));
  if (early)
    return 1;
  return 2;
}

/* --- the geometry lock: a writer thread that reports when it is in --- */

static atomic_bool writer_in, reader_in;

static void *
writer_thread (void *unused)
{
  percpu_rwlock_write_lock (&geometry);
  atomic_store (&writer_in, true);
  percpu_rwlock_write_unlock (&geometry);
  return NULL;
}

static void *
reader_thread (void *unused)
{
  percpu_rwlock_token t = percpu_rwlock_read_lock (&geometry);

  atomic_store (&reader_in, true);
  percpu_rwlock_read_unlock (&geometry, t);
  return NULL;
}

/* Wait up to 10 s (the machine may be busy) for a flag. */
static bool
wait_for (atomic_bool *flag)
{
  for (int i = 0; i < 10000; ++i) {
    if (atomic_load (flag))
      return true;
    usleep (1000);
  }
  return false;
}

static int
read_locked_return (pthread_t *w)
{
  SCOPED_GEOMETRY_READ_LOCK (&geometry);

  atomic_store (&writer_in, false);
  pthread_create (w, NULL, writer_thread, NULL);
  usleep (200 * 1000);
  if (atomic_load (&writer_in))
    FAIL ("a writer got the geometry lock while a scoped reader held it");
  return 0;                     /* the writer gets in after this */
}

static void
test_geometry_locks (void)
{
  pthread_t w, r;

  /* Read side: a writer waits until the scope is left by return... */
  read_locked_return (&w);
  if (!wait_for (&writer_in))
    FAIL ("the writer never got in after the scoped reader returned");
  pthread_join (w, NULL);

  /* ...or by break out of a loop body. */
  for (;;) {
    SCOPED_GEOMETRY_READ_LOCK (&geometry);
    atomic_store (&writer_in, false);
    pthread_create (&w, NULL, writer_thread, NULL);
    usleep (100 * 1000);
    CHECK (!atomic_load (&writer_in));
    break;
  }
  if (!wait_for (&writer_in))
    FAIL ("the writer never got in after break out of the read scope");
  pthread_join (w, NULL);

  /* Write side: a reader waits until the scope ends. */
  {
    SCOPED_GEOMETRY_WRITE_LOCK (&geometry);
    atomic_store (&reader_in, false);
    pthread_create (&r, NULL, reader_thread, NULL);
    usleep (200 * 1000);
    if (atomic_load (&reader_in))
      FAIL ("a reader got the geometry lock inside a scoped write lock");
  }
  if (!wait_for (&reader_in))
    FAIL ("the reader never got in after the scoped writer's block");
  pthread_join (r, NULL);

  /* Nested read scopes in one thread: the inner one's unlock leaves the
   * outer one held.  (Only with no writer waiting while the inner one is
   * taken: a reader arriving then queues behind the writer, which waits
   * for the outer one, so nesting across a write lock would deadlock.)
   */
  {
    SCOPED_GEOMETRY_READ_LOCK (&geometry);
    {
      SCOPED_GEOMETRY_READ_LOCK (&geometry);
    }
    atomic_store (&writer_in, false);
    pthread_create (&w, NULL, writer_thread, NULL);
    usleep (100 * 1000);
    if (atomic_load (&writer_in))
      FAIL ("the inner scope's unlock released the outer read lock");
  }
  if (!wait_for (&writer_in))
    FAIL ("the writer never got in after nested read scopes");
  pthread_join (w, NULL);
}

int
main (void)
{
  /* End of block. */
  {
    SCOPED_MUTEX_LOCK (&m1);
    CHECK (!mutex_is_free (&m1));
    CHECK (mutex_is_free (&m2));
  }
  CHECK (mutex_is_free (&m1));

  /* return, with two locks in one scope. */
  CHECK (locked_return (true) == 1);
  CHECK (mutex_is_free (&m1) && mutex_is_free (&m2));
  CHECK (locked_return (false) == 2);
  CHECK (mutex_is_free (&m1) && mutex_is_free (&m2));

  /* A loop: taken and released once per iteration. */
  for (int i = 0; i < 1000; ++i) {
    SCOPED_MUTEX_LOCK (&m1);
    if (i == 999)
      CHECK (!mutex_is_free (&m1));
  }
  CHECK (mutex_is_free (&m1));
  printf ("scoped mutex: end of block, return, loop: ok\n");

  if (percpu_rwlock_init (&geometry) < 0)
    FAIL ("percpu_rwlock_init");
  test_geometry_locks ();
  percpu_rwlock_destroy (&geometry);
  printf ("scoped geometry read and write locks: ok\n");
  return EXIT_SUCCESS;
}
