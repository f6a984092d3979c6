/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: which runs prune keeps.
 *
 * The rules of Proxmox Backup Server's prune (keep-last, -hourly,
 * -daily, -weekly, -monthly, -yearly), so that an administrator who
 * knows one knows the other: see repo-retention.h.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "repo-retention.h"

enum mark { UNMARKED, KEEP, REMOVE };

const char *
repo_keep_name (enum repo_keep k)
{
  static const char *names[] = { "last", "hourly", "daily", "weekly",
                                 "monthly", "yearly" };
  return names[k];
}

/* The period of run t for rule k, as a string that is equal for two
 * runs in the same period.
 */
static void
period_of (enum repo_keep k, const struct repo_prune_run *r, char *out,
           size_t len)
{
  time_t t = r->time;
  struct tm tm;

  localtime_r (&t, &tm);
  switch (k) {
  case REPO_KEEP_LAST: snprintf (out, len, "run %ld", r->run); break;
  case REPO_KEEP_HOURLY: strftime (out, len, "%Y/%m/%d/%H", &tm); break;
  case REPO_KEEP_DAILY: strftime (out, len, "%Y/%m/%d", &tm); break;
  case REPO_KEEP_WEEKLY: strftime (out, len, "%G/%V", &tm); break;
  case REPO_KEEP_MONTHLY: strftime (out, len, "%Y/%m", &tm); break;
  default: strftime (out, len, "%Y", &tm); break;
  }
}

static int
newest_first (const void *a, const void *b)
{
  const struct repo_prune_run *x = *(struct repo_prune_run *const *) a;
  const struct repo_prune_run *y = *(struct repo_prune_run *const *) b;

  if (x->time != y->time)
    return x->time > y->time ? -1 : 1;
  return x->run > y->run ? -1 : x->run < y->run;
}

void
repo_prune_select (struct repo_prune_run *runs, size_t n,
                   const long keep[REPO_KEEP_N])
{
  struct repo_prune_run **sorted = calloc (n ? n : 1, sizeof *sorted);
  enum mark *mark = calloc (n ? n : 1, sizeof *mark);
  char (*periods)[32] = calloc (n ? n : 1, 32);
  char (*kept)[32] = calloc (n ? n : 1, 32);
  bool any = false;

  if (sorted == NULL || mark == NULL || periods == NULL || kept == NULL)
    abort ();
  for (size_t i = 0; i < n; ++i)
    sorted[i] = &runs[i];
  if (n > 1)
    qsort (sorted, n, sizeof *sorted, newest_first);
  for (int k = 0; k < REPO_KEEP_N; ++k) {
    size_t nkept = 0, already = 0;
    char (*done)[32] = calloc (n ? n : 1, 32);

    if (keep[k] <= 0) {
      free (done);
      continue;
    }
    any = true;
    /* Periods of runs an earlier rule kept count as covered. */
    for (size_t i = 0; i < n; ++i) {
      period_of (k, sorted[i], periods[i], 32);
      if (mark[i] == KEEP)
        memcpy (done[already++], periods[i], 32);
    }
    for (size_t i = 0; i < n; ++i) {
      bool seen = false;
      if (mark[i] != UNMARKED)
        continue;
      for (size_t j = 0; j < already && !seen; ++j)
        seen = strcmp (done[j], periods[i]) == 0;
      if (seen)
        continue;
      for (size_t j = 0; j < nkept && !seen; ++j)
        seen = strcmp (kept[j], periods[i]) == 0;
      if (!seen) {
        if ((long) nkept >= keep[k])
          break;
        memcpy (kept[nkept++], periods[i], 32);
        mark[i] = KEEP;
        sorted[i]->reason = repo_keep_name (k);
      }
      else
        mark[i] = REMOVE;
    }
    free (done);
  }
  for (size_t i = 0; i < n; ++i) {
    sorted[i]->keep = !any || mark[i] == KEEP;
    if (!any)
      sorted[i]->reason = "no rule";
    else if (mark[i] != KEEP)
      sorted[i]->reason = NULL;
  }
  free (sorted);
  free (mark);
  free (periods);
  free (kept);
}
