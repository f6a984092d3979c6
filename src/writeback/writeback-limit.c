/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: how much may be held in a memory cgroup
 * (writeback_max_for_memory in writeback.h).
 *
 * Held data lives in a memory file (held-file.c): shared memory, charged
 * to the process's memory cgroup and never reclaimable (there is no
 * swap to push it to, and it cannot be written back before its round is
 * durable).  A writeback-max larger than the cgroup allows turns a
 * burst of first writes into an OOM kill: measured, nbdkit in a 96M v1
 * cgroup with writeback-max=512M was killed after about 85 MiB held.
 * So writeback-max never exceeds a share of the cgroup's headroom at
 * start-up: its limit (the smallest on the way up the hierarchy; v1
 * memory.limit_in_bytes, v2 memory.max and memory.high) less what the
 * cgroup uses already (the process's own memory, and whatever else the
 * cgroup runs), page cache not counted: it is reclaimed under the
 * limit.  A share, not all of it: the process's other memory
 * grows too (requests' buffers, copy-out batches are counted in
 * writeback-max but a COW store's page cache is not), and the page
 * cache of the origin and the COW stores must be able to fill and be
 * written back without the cgroup's reclaim finding only held pages.
 * When the share is full writers wait for room: backpressure, never an
 * error and never a kill.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>

#include "engine.h"
#include "writeback.h"
#include "cleanup.h"
#include "snapfg-log.h"

/* The share of the cgroup's headroom held data may take. */
#define HEADROOM_SHARE_NUM 1
#define HEADROOM_SHARE_DEN 2
/* Below this, hold nothing more than this: one request's worth. */
#define CGROUP_MAX_FLOOR (1024 * 1024)
/* Limits at or past this are "no limit" (v1 says 0x7ffffffffffff000). */
#define NO_LIMIT (UINT64_C (1) << 62)

/* A number from a cgroup file ("max": NO_LIMIT), or false. */
static bool
read_cgroup_value (const char *dir, const char *name, uint64_t *value)
{
  CLEANUP_FREE char *path = NULL;
  char buf[64];
  FILE *fp;
  bool ok;

  if (asprintf (&path, "%s/%s", dir, name) == -1)
    return false;
  fp = fopen (path, "re");
  if (fp == NULL)
    return false;
  ok = fgets (buf, sizeof buf, fp) != NULL;
  fclose (fp);
  if (!ok)
    return false;
  if (strncmp (buf, "max", 3) == 0) {
    *value = NO_LIMIT;
    return true;
  }
  errno = 0;
  *value = strtoull (buf, NULL, 10);
  return errno == 0;
}

/* The page cache charged to the cgroup (and its children), from
 * memory.stat: it counts in the usage but is reclaimed under the limit,
 * so it is no memory taken.  (Held data is shared memory, on the
 * anonymous lists, never in these.)  0 if the file cannot be read.
 */
static uint64_t
cgroup_file_pages (const char *dir, bool v2)
{
  CLEANUP_FREE char *path = NULL;
  char key[64];
  unsigned long long value;
  uint64_t total = 0;
  FILE *fp;

  if (asprintf (&path, "%s/memory.stat", dir) == -1)
    return 0;
  fp = fopen (path, "re");
  if (fp == NULL)
    return 0;
  while (fscanf (fp, "%63s %llu", key, &value) == 2)
    /* v1: total_* includes the children, as usage_in_bytes does. */
    if (strcmp (key, v2 ? "active_file" : "total_active_file") == 0 ||
        strcmp (key, v2 ? "inactive_file" : "total_inactive_file") == 0)
      total += value;
  fclose (fp);
  return total;
}

/* The hierarchy holding the memory controller: its mount point and the
 * path (in the hierarchy) of that mount's root, from /proc/self/mountinfo;
 * v2 true for cgroup2.  The v1 memory hierarchy is preferred: on a
 * hybrid system the v2 one has no memory controller.
 */
static bool
find_memory_mount (char **mount, char **root, bool *v2)
{
  FILE *fp = fopen ("/proc/self/mountinfo", "re");
  char *line = NULL;
  size_t n = 0;
  bool found = false;

  if (fp == NULL)
    return false;
  while (getline (&line, &n, fp) > 0) {
    char r[4096], m[4096], type[64], opts[1024];
    const char *sep = strstr (line, " - ");

    /* ID PARENT MAJ:MIN ROOT MOUNT OPTS [TAGS...] - TYPE SOURCE SUPEROPTS */
    if (sep == NULL ||
        sscanf (line, "%*s %*s %*s %4095s %4095s", r, m) != 2 ||
        sscanf (sep, " - %63s %*s %1023s", type, opts) != 2)
      continue;
    if (strcmp (type, "cgroup") == 0) {
      char *o, *save = NULL;
      bool memory = false;

      for (o = strtok_r (opts, ",", &save); o; o = strtok_r (NULL, ",", &save))
        memory |= strcmp (o, "memory") == 0;
      if (!memory)
        continue;
      free (*mount); free (*root);
      *mount = strdup (m);
      *root = strdup (r);
      *v2 = false;
      found = *mount && *root;
      break;
    }
    if (strcmp (type, "cgroup2") == 0 && !found) {
      free (*mount); free (*root);
      *mount = strdup (m);
      *root = strdup (r);
      *v2 = true;
      found = *mount && *root;
    }
  }
  free (line);
  fclose (fp);
  return found;
}

/* The process's cgroup path in that hierarchy, from /proc/self/cgroup. */
static char *
own_cgroup (bool v2)
{
  FILE *fp = fopen ("/proc/self/cgroup", "re");
  char *line = NULL, *path = NULL;
  size_t n = 0;

  if (fp == NULL)
    return NULL;
  while (path == NULL && getline (&line, &n, fp) > 0) {
    char *controllers = strchr (line, ':'), *p;

    if (controllers == NULL || (p = strchr (++controllers, ':')) == NULL)
      continue;
    *p++ = '\0';
    p[strcspn (p, "\n")] = '\0';
    if (v2 ? controllers[0] == '\0' : false)
      path = strdup (p);
    else if (!v2) {
      char *c, *save = NULL;

      for (c = strtok_r (controllers, ",", &save); c;
           c = strtok_r (NULL, ",", &save))
        if (strcmp (c, "memory") == 0) {
          path = strdup (p);
          break;
        }
    }
  }
  free (line);
  fclose (fp);
  return path;
}

/* The headroom of the process's memory cgroup and its ancestors: the
 * smallest limit less usage on the way up, and that limit; false if
 * there is no limit (or no cgroup to be found).
 */
static bool
cgroup_headroom (uint64_t *headroom, uint64_t *limit_out)
{
  CLEANUP_FREE char *mount = NULL, *root = NULL, *cg = NULL;
  bool v2 = false, limited = false;
  size_t root_len;

  if (!find_memory_mount (&mount, &root, &v2) ||
      (cg = own_cgroup (v2)) == NULL)
    return false;
  /* The path relative to the mount: a container sees its own cgroup as
   * the root of the mount.
   */
  root_len = strcmp (root, "/") == 0 ? 0 : strlen (root);
  if (root_len && strncmp (cg, root, root_len) != 0)
    return false;
  for (char *rel = cg + root_len; ; ) {
    CLEANUP_FREE char *dir = NULL;
    uint64_t limit = NO_LIMIT, value, usage = 0;
    char *slash;

    if (asprintf (&dir, "%s%s", mount, rel) == -1)
      return limited;
    if (v2) {
      if (read_cgroup_value (dir, "memory.max", &value) && value < limit)
        limit = value;
      if (read_cgroup_value (dir, "memory.high", &value) && value < limit)
        limit = value;
      read_cgroup_value (dir, "memory.current", &usage);
    }
    else {
      if (read_cgroup_value (dir, "memory.limit_in_bytes", &value))
        limit = value;
      read_cgroup_value (dir, "memory.usage_in_bytes", &usage);
    }
    if (limit < NO_LIMIT) {
      uint64_t room, cache = cgroup_file_pages (dir, v2);

      usage = cache < usage ? usage - cache : 0;
      room = usage < limit ? limit - usage : 0;

      if (!limited || room < *headroom) {
        *headroom = room;
        *limit_out = limit;
      }
      limited = true;
    }
    /* Up one level, to the mount's root. */
    slash = strrchr (rel, '/');
    if (slash == NULL || rel[0] == '\0' || strcmp (rel, "/") == 0)
      break;
    *slash = '\0';
  }
  return limited;
}

uint64_t
writeback_max_for_memory (bool on, uint64_t requested)
{
  uint64_t max = requested ? requested : snapfg_default_writeback_max ();
  uint64_t headroom = 0, limit = 0, allowed;

  if (!on || !cgroup_headroom (&headroom, &limit))
    return max;
  allowed = headroom / HEADROOM_SHARE_DEN * HEADROOM_SHARE_NUM;
  allowed &= ~(uint64_t) (64 * 1024 - 1);
  if (allowed < CGROUP_MAX_FLOOR)
    allowed = CGROUP_MAX_FLOOR;
  if (max <= allowed)
    return max;
  if (requested)
    snapfg_error ("writeback-max=%" PRIu64 " is more than the memory "
                  "cgroup allows: its limit is %" PRIu64 " bytes with %"
                  PRIu64 " free at start-up, and held data cannot be "
                  "reclaimed; writeback-max is %" PRIu64 " (a half of "
                  "that) so that writers wait for room before the cgroup "
                  "runs out", requested, limit, headroom, allowed);
  else
    snapfg_debug ("writeback-max: %" PRIu64 " (a half of the %" PRIu64
                  " bytes free of the memory cgroup's limit of %" PRIu64
                  ") rather than %" PRIu64, allowed, headroom, limit, max);
  return allowed;
}
