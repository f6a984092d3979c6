/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: holding new origin writes (the control socket's suspend and
 * resume, in the manner of dm's suspend/resume; docs/design.md
 * section 4, "Suspend").
 *
 * A suspend takes the geometry write side for a moment, so that every
 * origin change in flight finishes, and leaves the engine suspended: an
 * origin write, zero or trim that starts meanwhile finds the flag under
 * its read side, lets the read side go and sleeps until the resume.  So
 * a snapshot created while suspended (which takes the write side too)
 * is not held up by the waiting writers, and its instant is the
 * suspend's.  Reads, snapshot views and flushes are not held.
 *
 * A suspend always ends: at the resume, or at its timeout, when a
 * thread of its own resumes and logs it, so that a backup host that
 * dies between its suspend and its resume never freezes a VM.
 */
#ifndef SNAPFG_SUSPEND_H
#define SNAPFG_SUSPEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct snapfg_engine;

struct engine_suspend {
  /* Set under the geometry write side and the lock below; read by
   * origin writers under the read side.
   */
  atomic_bool suspended;

  pthread_mutex_t lock;         /* everything below */
  pthread_cond_t changed;       /* resumed (writers), or asked to stop (timer) */
  uint64_t id;                  /* the current or last suspend, from 1 */
  uint64_t since_ns;            /* when the current one began (monotonic) */
  uint64_t deadline_ns;         /* when it ends by itself */
  uint64_t timeout_ms;          /* as asked */
  bool timed_out;               /* the last one ended by its timeout */
  pthread_t timer;              /* ends the current one at deadline_ns */
  bool timer_unjoined;          /* started and not joined yet */
  unsigned waiting;             /* origin writers sleeping now */
  uint64_t count;               /* suspends, in all */
  uint64_t timeouts;            /* of them ended by their timeout */
  uint64_t held_writes;         /* origin writes that waited, in all */
  uint64_t held_ns;             /* time suspended, in all, ended ones */
};

extern void suspend_init (struct engine_suspend *sp);
/* Resumes a suspend still in force (closing never leaves writers
 * asleep) and joins its timer.
 */
extern void suspend_destroy (struct snapfg_engine *e);

/* Called by an origin change that found 'suspended' set under the read
 * side, after it let the read side go: sleeps until the resume.
 */
extern void suspend_wait (struct snapfg_engine *e);

static inline bool
suspend_holds_writes (struct engine_suspend *sp)
{
  return atomic_load_explicit (&sp->suspended, memory_order_acquire);
}

#endif
