/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: locks held for the rest of the current scope.
 *
 *   SCOPED_MUTEX_LOCK (&m);                  pthread mutex
 *
 * (the engine's geometry lock has its own, SCOPED_GEOMETRY_READ_LOCK and
 * SCOPED_GEOMETRY_WRITE_LOCK, beside it in common/percpu-rwlock.h,
 * built on SCOPED_LOCK_NAME below.)
 *
 * The lock is taken where the macro stands and released when the
 * enclosing block is left, by any path (end of block, return, goto out,
 * break out of a loop body).  Every exit of a function then unlocks
 * without an unlock written before each return.  To hold a lock for less
 * than the whole function, put the macro and the locked code in a block
 * of their own.
 *
 * Several of these may stand in one scope; they are released in the
 * reverse order of taking.  Each expands to a declaration, so it must
 * stand where a declaration may (not as the body of an unbraced if).
 * Keep to the locking rules of docs/design.md section 4: a scoped stripe
 * or commit lock still must not be held across I/O or an allocation, so
 * such a scope should be small.
 */
#ifndef SNAPFG_SCOPED_LOCK_H
#define SNAPFG_SCOPED_LOCK_H

#include <pthread.h>

/* A name unique within the translation unit, for the hidden variables. */
#define SCOPED_LOCK_CONCAT_(a, b) a##b
#define SCOPED_LOCK_CONCAT(a, b) SCOPED_LOCK_CONCAT_ (a, b)
#define SCOPED_LOCK_NAME(prefix) SCOPED_LOCK_CONCAT (prefix, __COUNTER__)

/* --- pthread mutex --- */

static inline pthread_mutex_t *
scoped_mutex_lock_ (pthread_mutex_t *m)
{
  pthread_mutex_lock (m);
  return m;
}

static inline void
scoped_mutex_unlock_ (pthread_mutex_t **m)
{
  pthread_mutex_unlock (*m);
}

#define SCOPED_MUTEX_LOCK(m)                                            \
  pthread_mutex_t *SCOPED_LOCK_NAME (scoped_mutex_)                     \
    __attribute__ ((cleanup (scoped_mutex_unlock_), unused))            \
    = scoped_mutex_lock_ (m)

#endif
