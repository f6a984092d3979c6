/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the engine's test hooks (engine-test-hooks.c), set from the
 * environment when the engine opens; all off in production.
 *
 *   SNAPFG_TEST_DELAY_US        widens the race windows
 *   SNAPFG_TEST_MERGE_DELAY_US  slows each merge batch
 *   SNAPFG_TEST_CRASH_AT=POINT[:N]  kills the process at a fault point
 *   SNAPFG_TEST_FAIL_AT=POINT[:N]   makes an allocation (or a held
 *       write's origin write) fail
 *   SNAPFG_TEST_WRITEBACK_PAUSE=FILE  holds every write back (none
 *       reaches the origin; copy-out batches are done when a writer
 *       waits for one of their chunks) while FILE exists, except at a
 *       stop
 */
#ifndef SNAPFG_ENGINE_TEST_HOOKS_H
#define SNAPFG_ENGINE_TEST_HOOKS_H

#include <stdatomic.h>
#include <stdbool.h>

struct snapfg_engine;

/* Test-only crash points (SNAPFG_TEST_CRASH_AT). */
enum fault_point {
  FAULT_NONE,
  FAULT_AFTER_COW_DATA,
  FAULT_AFTER_COW_RUN,         /* one run of a batch written, not committed */
  FAULT_AFTER_METADATA,
  FAULT_BEFORE_ORIGIN_WRITE,
  FAULT_MERGE_BATCH,           /* a merge batch copied, not yet forgotten */
};

/* Test-only allocation failures (SNAPFG_TEST_FAIL_AT). */
enum fail_point {
  FAIL_NONE,
  FAIL_SNAPSHOT_LIST,          /* growing the engine's list of snapshots */
  FAIL_HELD_DATA,              /* holding a write's data (write-back) */
  FAIL_HELD_APPLY,             /* a held write's origin write (EIO) */
};

struct engine_test_hooks {
  unsigned delay_us;           /* SNAPFG_TEST_DELAY_US */
  unsigned merge_delay_us;     /* SNAPFG_TEST_MERGE_DELAY_US */
  enum fault_point fault_at;   /* SNAPFG_TEST_CRASH_AT */
  atomic_long fault_countdown;
  enum fail_point fail_at;     /* SNAPFG_TEST_FAIL_AT */
  atomic_long fail_countdown;
  const char *writeback_pause_path;  /* SNAPFG_TEST_WRITEBACK_PAUSE */
};

/* Read SNAPFG_TEST_CRASH_AT / SNAPFG_TEST_FAIL_AT's value SPEC (NULL:
 * not set) into the engine (engine-test-hooks.c).
 */
extern void engine_parse_fault_point (struct snapfg_engine *e,
                                      const char *spec);
extern void engine_parse_fail_point (struct snapfg_engine *e,
                                     const char *spec);
/* Die here if the test hook asks for it. */
extern void engine_fault_point (struct snapfg_engine *e,
                                enum fault_point where);

/* Is the test hook set to die at 'where'?  (So that a walk made only
 * for its fault points can be skipped.)
 */
extern bool engine_fault_armed (const struct snapfg_engine *e,
                                enum fault_point where);

/* Should the allocation at 'where' fail, as the test hook asks? */
extern bool engine_fail_point (struct snapfg_engine *e, enum fail_point where);

/* Is write-back paused by the test hook (its file exists)? */
extern bool engine_writeback_paused (const struct snapfg_engine *e);

/* Sleep for the test hook, if set. */
extern void engine_test_delay (const struct snapfg_engine *e);

#endif
