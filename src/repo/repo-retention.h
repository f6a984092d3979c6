/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: which runs prune keeps (Proxmox Backup's rules). */
#ifndef SNAPFG_REPO_RETENTION_H
#define SNAPFG_REPO_RETENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum repo_keep {
  REPO_KEEP_LAST, REPO_KEEP_HOURLY, REPO_KEEP_DAILY, REPO_KEEP_WEEKLY,
  REPO_KEEP_MONTHLY, REPO_KEEP_YEARLY, REPO_KEEP_N
};

struct repo_prune_run {
  long run;
  int64_t time;                 /* when it started, seconds since the epoch */
  bool keep;                    /* the result */
  const char *reason;           /* "last", "hourly", ... or NULL: removed */
};

/* Mark the runs to keep.  keep[i] is the number of KEEP_i to keep (0:
 * that rule keeps none).  Each rule, in the order of enum repo_keep,
 * walks the runs newest first and keeps the newest run of each period
 * (hour, day, ISO week, month, year in local time; every run for
 * "last") that no earlier rule kept a run of, until it has kept its
 * number of periods; a run in a period it has already kept one of is
 * marked removed.  Runs no rule kept are removed.  With every keep[i]
 * 0, all runs are kept.  runs need not be sorted.
 */
extern void repo_prune_select (struct repo_prune_run *runs, size_t n,
                               const long keep[REPO_KEEP_N]);

extern const char *repo_keep_name (enum repo_keep k);

#endif
