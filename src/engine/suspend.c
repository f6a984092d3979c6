/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: holding new origin writes between a suspend and its resume
 * (see suspend.h and docs/design.md section 4, "Suspend").
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "engine-internal.h"
#include "scoped-lock.h"
#include "snapfg-log.h"

/* suspend and resume one at a time (the control server has one thread,
 * but the engine is a library): outside the geometry lock.
 */
static pthread_mutex_t suspend_ops_lock = PTHREAD_MUTEX_INITIALIZER;

void
suspend_init (struct engine_suspend *sp)
{
  pthread_condattr_t attr;

  atomic_init (&sp->suspended, false);
  pthread_mutex_init (&sp->lock, NULL);
  /* The timer sleeps until a monotonic deadline: a clock set back must
   * not stretch a suspend.
   */
  pthread_condattr_init (&attr);
  pthread_condattr_setclock (&attr, CLOCK_MONOTONIC);
  pthread_cond_init (&sp->changed, &attr);
  pthread_condattr_destroy (&attr);
}

/* End the current suspend (with sp->lock held). */
static void
end_locked (struct engine_suspend *sp, bool timed_out)
{
  atomic_store_explicit (&sp->suspended, false, memory_order_release);
  sp->held_ns += stats_now_ns () - sp->since_ns;
  sp->timed_out = timed_out;
  if (timed_out)
    sp->timeouts++;
  pthread_cond_broadcast (&sp->changed);
}

/* The current suspend's timer: resumes at its deadline unless the
 * resume came first.
 */
static void *
suspend_timer (void *arg)
{
  struct snapfg_engine *e = arg;
  struct engine_suspend *sp = &e->suspend;
  bool expired = false;
  uint64_t id, timeout_ms;
  unsigned waiting = 0;

  {
    SCOPED_MUTEX_LOCK (&sp->lock);
    struct timespec deadline = {
      .tv_sec = sp->deadline_ns / 1000000000,
      .tv_nsec = sp->deadline_ns % 1000000000,
    };

    id = sp->id;
    timeout_ms = sp->timeout_ms;
    while (suspend_holds_writes (sp) && sp->id == id) {
      if (pthread_cond_timedwait (&sp->changed, &sp->lock, &deadline)
          == ETIMEDOUT && suspend_holds_writes (sp) && sp->id == id) {
        waiting = sp->waiting;
        end_locked (sp, true);
        expired = true;
      }
    }
  }
  if (expired)
    snapfg_error ("origin=%s: suspend %" PRIu64 " ended by its timeout of "
                  "%" PRIu64 " ms (no resume came: whoever suspended it may "
                  "have died); origin writes go on, %u were waiting",
                  e->origin.path, id, timeout_ms, waiting);
  return NULL;
}

/* A timer that ended its suspend by itself is joined by the next
 * suspend or the close (with suspend_ops_lock held).
 */
static void
join_finished_timer (struct engine_suspend *sp)
{
  pthread_t t;

  {
    SCOPED_MUTEX_LOCK (&sp->lock);
    if (!sp->timer_unjoined)
      return;
    sp->timer_unjoined = false;
    t = sp->timer;
  }
  pthread_join (t, NULL);
}

int
snapfg_suspend (struct snapfg_engine *e, uint64_t timeout_ms, uint64_t *id)
{
  struct engine_suspend *sp = &e->suspend;
  SCOPED_MUTEX_LOCK (&suspend_ops_lock);
  int err;

  if (timeout_ms < SNAPFG_SUSPEND_MIN_TIMEOUT_MS ||
      timeout_ms > SNAPFG_SUSPEND_MAX_TIMEOUT_MS)
    return snapfg_fail (EINVAL, "suspend: timeout %" PRIu64 " ms is out of "
                        "bounds (%d ms to %d s)", timeout_ms,
                        SNAPFG_SUSPEND_MIN_TIMEOUT_MS,
                        SNAPFG_SUSPEND_MAX_TIMEOUT_MS / 1000);
  if (e->origin.readonly)
    return snapfg_fail (EROFS, "suspend: origin=%s is read-only: there are "
                        "no writes to hold", e->origin.path);
  if (suspend_holds_writes (sp))
    return snapfg_fail (EBUSY, "suspend: origin writes are already held "
                        "(suspend %" PRIu64 "): resume first", sp->id);
  join_finished_timer (sp);

  /* The write side waits for every origin change in flight: when it is
   * ours, none is, and every later one finds the flag.
   */
  SCOPED_GEOMETRY_WRITE_LOCK (&e->geometry);
  SCOPED_MUTEX_LOCK (&sp->lock);
  sp->since_ns = stats_now_ns ();
  sp->deadline_ns = sp->since_ns + timeout_ms * 1000000;
  sp->timeout_ms = timeout_ms;
  sp->timed_out = false;
  sp->id++;
  atomic_store_explicit (&sp->suspended, true, memory_order_release);
  err = pthread_create (&sp->timer, NULL, suspend_timer, e);
  if (err) {
    /* Without its timer a suspend could last for ever: refuse it. */
    atomic_store_explicit (&sp->suspended, false, memory_order_release);
    return snapfg_fail (err, "suspend: cannot start its timer thread: %s",
                        strerror (err));
  }
  sp->timer_unjoined = true;
  sp->count++;
  *id = sp->id;
  return 0;
}

/* With sp->lock held. */
static void
info_locked (struct engine_suspend *sp, struct snapfg_suspend_info *info)
{
  uint64_t now = stats_now_ns ();
  bool on = suspend_holds_writes (sp);

  memset (info, 0, sizeof *info);
  info->suspended = on;
  info->id = sp->id;
  info->timeout_ms = sp->timeout_ms;
  info->timed_out = !on && sp->timed_out;
  info->waiting = sp->waiting;
  info->count = sp->count;
  info->timeouts = sp->timeouts;
  info->held_writes = sp->held_writes;
  info->held_ms_total = sp->held_ns / 1000000;
  if (on) {
    info->held_ms = (now - sp->since_ns) / 1000000;
    info->remaining_ms = sp->deadline_ns > now
      ? (sp->deadline_ns - now) / 1000000 : 0;
    info->held_ms_total += info->held_ms;
  }
}

void
snapfg_resume (struct snapfg_engine *e, struct snapfg_suspend_info *info)
{
  struct engine_suspend *sp = &e->suspend;
  SCOPED_MUTEX_LOCK (&suspend_ops_lock);
  struct snapfg_suspend_info before;

  {
    SCOPED_MUTEX_LOCK (&sp->lock);
    info_locked (sp, &before);
    /* No geometry lock needed: a writer that still saw the flag finds
     * it cleared under sp->lock and goes on.
     */
    if (before.suspended)
      end_locked (sp, false);
  }
  join_finished_timer (sp);
  if (before.suspended)
    snapfg_notice ("origin=%s: resumed suspend %" PRIu64 " after %" PRIu64
                   " ms (%u origin writes were waiting)", e->origin.path,
                   before.id, before.held_ms, before.waiting);
  if (info)
    *info = before;
}

void
snapfg_suspend_info (struct snapfg_engine *e,
                     struct snapfg_suspend_info *info)
{
  SCOPED_MUTEX_LOCK (&e->suspend.lock);
  info_locked (&e->suspend, info);
}

void
suspend_wait (struct snapfg_engine *e)
{
  struct engine_suspend *sp = &e->suspend;
  SCOPED_MUTEX_LOCK (&sp->lock);

  if (!suspend_holds_writes (sp))
    return;
  sp->waiting++;
  sp->held_writes++;
  while (suspend_holds_writes (sp))
    pthread_cond_wait (&sp->changed, &sp->lock);
  sp->waiting--;
}

void
suspend_destroy (struct snapfg_engine *e)
{
  struct engine_suspend *sp = &e->suspend;

  if (suspend_holds_writes (sp))
    snapfg_resume (e, NULL);
  {
    SCOPED_MUTEX_LOCK (&suspend_ops_lock);
    join_finished_timer (sp);
  }
  pthread_cond_destroy (&sp->changed);
  pthread_mutex_destroy (&sp->lock);
}
