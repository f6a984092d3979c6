/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the engine's test hooks, set from the environment when the
 * engine opens (SNAPFG_TEST_CRASH_AT, SNAPFG_TEST_FAIL_AT,
 * SNAPFG_TEST_DELAY_US): crash points, failed allocations and delays that
 * let the tests reach crash orderings and error paths deterministically.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>

#include "engine-internal.h"
#include "snapfg-log.h"

/* SPEC is WHERE[:N]: the point in POINTS named WHERE (NONE if none is),
 * and in *COUNT the N (default 1).
 */
struct test_point {
  const char *name;
  int where;
};

static int
parse_test_point (const char *spec, const struct test_point *points,
                  size_t npoints, int none, long *count)
{
  const char *colon = strchr (spec, ':');
  size_t len = colon ? (size_t) (colon - spec) : strlen (spec);
  int where = none;

  for (size_t i = 0; i < npoints; ++i)
    if (strlen (points[i].name) == len &&
        strncmp (spec, points[i].name, len) == 0)
      where = points[i].where;
  *count = colon ? strtol (colon + 1, NULL, 10) : 1;
  return where;
}

/* Test hook: SNAPFG_TEST_CRASH_AT=WHERE[:N] kills the process at the Nth
 * (default first) time it reaches WHERE: "cow-data" (a copy-out's data,
 * or all of a batch's, is written, not yet committed), "cow-run" (one run
 * of consecutive chunks of a batch is written; the batch's other runs may
 * not be), "metadata" (the exception, or the whole batch, is committed),
 * "origin-write" (just before any origin write), "merge" (a merge batch
 * is copied into the origin but still in the COW table).
 */
void
engine_parse_fault_point (struct snapfg_engine *e, const char *spec)
{
  static const struct test_point points[] = {
    { "cow-data", FAULT_AFTER_COW_DATA },
    { "cow-run", FAULT_AFTER_COW_RUN },
    { "metadata", FAULT_AFTER_METADATA },
    { "origin-write", FAULT_BEFORE_ORIGIN_WRITE },
    { "merge", FAULT_MERGE_BATCH },
  };
  long count;

  e->test.fault_at = FAULT_NONE;
  if (spec == NULL || *spec == '\0')
    return;
  e->test.fault_at = parse_test_point (spec, points,
                                  sizeof points / sizeof points[0],
                                  FAULT_NONE, &count);
  atomic_init (&e->test.fault_countdown, count);
  if (e->test.fault_at == FAULT_NONE)
    snapfg_error ("SNAPFG_TEST_CRASH_AT=%s: unknown fault point", spec);
}

/* Test hook: SNAPFG_TEST_FAIL_AT=WHERE[:N] makes the Nth (default first)
 * allocation at WHERE fail as if memory ran out: "snapshot-list"
 * (adding a snapshot to the engine's list), "held-data" (storing a held
 * write's data in write-back's memory file); or "held-apply": the Nth
 * held write the write-back committer applies fails with EIO, as a
 * disk error after the acknowledgement would.  Error paths that no
 * other test can reach deterministically are tested with it.
 */
void
engine_parse_fail_point (struct snapfg_engine *e, const char *spec)
{
  static const struct test_point points[] = {
    { "snapshot-list", FAIL_SNAPSHOT_LIST },
    { "held-data", FAIL_HELD_DATA },
    { "held-apply", FAIL_HELD_APPLY },
  };
  long count;

  e->test.fail_at = FAIL_NONE;
  if (spec == NULL || *spec == '\0')
    return;
  e->test.fail_at = parse_test_point (spec, points,
                                 sizeof points / sizeof points[0],
                                 FAIL_NONE, &count);
  if (e->test.fail_at == FAIL_NONE)
    snapfg_error ("SNAPFG_TEST_FAIL_AT=%s: unknown failure point", spec);
  atomic_init (&e->test.fail_countdown, count);
}

void
engine_fault_point (struct snapfg_engine *e, enum fault_point where)
{
  if (e->test.fault_at != where)
    return;
  if (atomic_fetch_sub (&e->test.fault_countdown, 1) != 1)
    return;
  /* Die the way a crash or kill -9 would: no cleanup, no flush. */
  snapfg_debug ("test fault point %d reached: killing the process", where);
  kill (getpid (), SIGKILL);
  pause ();
}

bool
engine_fault_armed (const struct snapfg_engine *e, enum fault_point where)
{
  return e->test.fault_at == where;
}

bool
engine_fail_point (struct snapfg_engine *e, enum fail_point where)
{
  if (e->test.fail_at != where)
    return false;
  if (atomic_fetch_sub (&e->test.fail_countdown, 1) != 1)
    return false;
  snapfg_debug ("test failure point %d reached: failing the allocation",
                where);
  return true;
}

bool
engine_writeback_paused (const struct snapfg_engine *e)
{
  return e->test.writeback_pause_path &&
    access (e->test.writeback_pause_path, F_OK) == 0;
}

void
engine_test_delay (const struct snapfg_engine *e)
{
  if (e->test.delay_us)
    usleep (e->test.delay_us);
}
