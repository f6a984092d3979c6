/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: verify, list, prune and gc on a repository. */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>

#include "snapfg-error.h"
#include "repo-gc.h"
#include "snapfg-backup-repo.h"

/* The disks a command works on: --disk, or all of them. */
static int
disks_of (struct repo_options *o, struct repo *r, char ***disks, size_t *n)
{
  int ret;

  if (o->disk) {
    if (!repo_disk_name_ok (o->disk)) {
      backup_error ("--disk %s: not a disk name", o->disk);
      return EXIT_USAGE;
    }
    *disks = calloc (1, sizeof **disks);
    if (*disks == NULL || ((*disks)[0] = strdup (o->disk)) == NULL)
      return EXIT_FAILED;
    *n = 1;
    return 0;
  }
  snapfg_clear_error ();
  if ((ret = repo_list_disks (r, disks, n)) < 0)
    return repo_fail (ret, NULL);
  return 0;
}

/* --- verify --- */

struct verify_state {
  struct repo *r;
  unsigned char *ids;           /* the distinct chunks to read */
  size_t n;
  atomic_size_t next;
  pthread_mutex_t lock;
  bool *bad;
  uint64_t nbad;
};

static int
cmp_id (const void *a, const void *b)
{
  return memcmp (a, b, REPO_DIGEST_LEN);
}

static void *
verify_thread (void *arg)
{
  struct verify_state *vs = arg;
  char *buf = malloc (repo_get_chunk_size (vs->r));
  size_t i;

  if (buf == NULL)
    return NULL;
  while (!backup_interrupted && (i = atomic_fetch_add (&vs->next, 1)) < vs->n) {
    snapfg_clear_error ();
    if (repo_read_chunk_id (vs->r, vs->ids + i * REPO_DIGEST_LEN, buf) < 0) {
      backup_error ("%s", snapfg_get_error ());
      pthread_mutex_lock (&vs->lock);
      vs->bad[i] = true;
      vs->nbad++;
      pthread_mutex_unlock (&vs->lock);
    }
  }
  free (buf);
  return NULL;
}

int
repo_cmd_verify (struct repo_options *o, const char *location)
{
  struct repo *r = NULL;
  struct repo_store *s;
  struct verify_state vs = { 0 };
  struct repo_index **ixs = NULL;
  size_t nix = 0, ndisks = 0, cap = 0;
  char **disks = NULL;
  unsigned threads = o->threads ? o->threads : REPO_DEFAULT_THREADS;
  pthread_t t[8];
  unsigned started = 0;
  json_t *results = json_array ();
  int status, ret;
  bool index_bad = false;

  if ((status = repo_open_for (o, location, true, &r)) != 0)
    return status;
  s = repo_get_store (r);
  if ((status = disks_of (o, r, &disks, &ndisks)) != 0)
    goto out;
  status = EXIT_FAILED;
  /* The points: --at N, --all, or each disk's latest. */
  for (size_t d = 0; d < ndisks; ++d) {
    long *runs = NULL;
    size_t nruns = 0;
    if (o->b.all) {
      if ((ret = repo_list_runs (r, disks[d], &runs, &nruns)) < 0) {
        repo_fail (ret, NULL);
        goto out;
      }
    }
    else {
      runs = malloc (sizeof *runs);
      runs[0] = o->b.at > 0 ? o->b.at : 0;
      nruns = 1;
    }
    for (size_t i = 0; i < nruns; ++i) {
      struct repo_index *ix;
      snapfg_clear_error ();
      if ((ret = repo_index_load (r, disks[d], runs[i], &ix)) < 0) {
        backup_error ("%s", snapfg_get_error ());
        if (ret != -ENOENT || o->b.all)
          index_bad = true;
        else if (o->disk) {
          free (runs);
          goto out;
        }
        continue;
      }
      if (nix == cap) {
        cap = cap * 2 + 8;
        ixs = realloc (ixs, cap * sizeof *ixs);
      }
      ixs[nix++] = ix;
    }
    free (runs);
  }
  /* Each distinct chunk once. */
  for (size_t i = 0; i < nix; ++i)
    for (uint64_t n = 0; n < repo_index_chunks (ixs[i]); ++n) {
      unsigned char *id = repo_index_digest (ixs[i], n);
      if (repo_digest_is_zero (id))
        continue;
      vs.ids = realloc (vs.ids, (vs.n + 1) * REPO_DIGEST_LEN);
      memcpy (vs.ids + vs.n++ * REPO_DIGEST_LEN, id, REPO_DIGEST_LEN);
    }
  if (vs.n) {
    size_t j = 0;
    if (vs.n > 1)
      qsort (vs.ids, vs.n, REPO_DIGEST_LEN, cmp_id);
    for (size_t i = 0; i < vs.n; ++i)
      if (j == 0 || memcmp (vs.ids + (j - 1) * REPO_DIGEST_LEN,
                            vs.ids + i * REPO_DIGEST_LEN, REPO_DIGEST_LEN))
        memmove (vs.ids + j++ * REPO_DIGEST_LEN, vs.ids + i * REPO_DIGEST_LEN,
                 REPO_DIGEST_LEN);
    vs.n = j;
  }
  vs.r = r;
  vs.bad = calloc (vs.n + 1, sizeof *vs.bad);
  atomic_init (&vs.next, 0);
  pthread_mutex_init (&vs.lock, NULL);
  for (unsigned i = 0; i < threads && i < 8; ++i)
    if (pthread_create (&t[i], NULL, verify_thread, &vs) == 0)
      started++;
  if (started == 0)
    verify_thread (&vs);
  for (unsigned i = 0; i < started; ++i)
    pthread_join (t[i], NULL);
  if (backup_interrupted) {
    backup_error ("interrupted");
    goto out;
  }
  /* The damaged ones are recorded: the next backup stores them again. */
  for (size_t i = 0; i < vs.n; ++i)
    if (vs.bad[i]) {
      char key[REPO_CHUNK_KEY_LEN], when[32];
      tool_iso_time (time (NULL), when);
      repo_damaged_key (vs.ids + i * REPO_DIGEST_LEN, key);
      if (s->ops->put (s, key, when, strlen (when), false) < 0)
        backup_error ("warning: %s", snapfg_get_error ());
    }
  /* Each point's result. */
  for (size_t i = 0; i < nix; ++i) {
    uint64_t bad = 0;
    char key[160], when[32];
    char *text;
    json_t *res;
    for (uint64_t n = 0; n < repo_index_chunks (ixs[i]); ++n) {
      unsigned char *id = repo_index_digest (ixs[i], n);
      unsigned char *p;
      if (repo_digest_is_zero (id))
        continue;
      p = bsearch (id, vs.ids, vs.n, REPO_DIGEST_LEN, cmp_id);
      if (p && vs.bad[(p - vs.ids) / REPO_DIGEST_LEN])
        bad++;
    }
    tool_iso_time (time (NULL), when);
    res = json_pack ("{s:s, s:i, s:b, s:I, s:s}", "disk",
                     repo_index_disk (ixs[i]), "run",
                     (int) repo_index_run (ixs[i]), "ok", bad == 0,
                     "damaged_chunks", (json_int_t) bad, "time", when);
    text = json_dumps (res, JSON_COMPACT);
    snprintf (key, sizeof key, "verify/%s/%08ld.json",
              repo_index_disk (ixs[i]), repo_index_run (ixs[i]));
    if (text && s->ops->put (s, key, text, strlen (text), false) < 0)
      backup_error ("warning: %s", snapfg_get_error ());
    free (text);
    if (!o->b.json)
      printf ("snapfg-backup: disk %s run %ld: %s\n", repo_index_disk (ixs[i]),
              repo_index_run (ixs[i]), bad ? "DAMAGED" : "ok");
    if (bad)
      printf ("snapfg-backup: disk %s run %ld: %" PRIu64 " damaged chunks: "
              "the next backup of the disk stores them again\n",
              repo_index_disk (ixs[i]), repo_index_run (ixs[i]), bad);
    json_array_append_new (results, res);
  }
  status = vs.nbad || index_bad ? EXIT_FAILED : EXIT_OK;
  if (nix == 0 && !index_bad) {
    backup_error ("%s: no run to verify", location);
    status = EXIT_FAILED;
  }
  if (o->b.json)
    tool_json_result (json_pack ("{s:s, s:s, s:I, s:I, s:o}",
                                 "command", "verify", "repository", location,
                                 "chunks", (json_int_t) vs.n,
                                 "damaged_chunks", (json_int_t) vs.nbad,
                                 "runs", json_incref (results)), status);
 out:
  json_decref (results);
  for (size_t i = 0; i < nix; ++i)
    repo_index_free (ixs[i]);
  free (ixs);
  free (vs.ids);
  free (vs.bad);
  repo_free_names (disks, ndisks);
  repo_close (r);
  return status;
}

/* --- list --- */

static int
sum_chunk (void *opaque, const struct repo_object_info *info)
{
  uint64_t *p = opaque;
  p[0]++;
  p[1] += info->size;
  return 0;
}

int
repo_cmd_list (struct repo_options *o, const char *location)
{
  struct repo *r = NULL;
  struct repo_store *s;
  char **disks = NULL;
  size_t ndisks = 0;
  json_t *jdisks = json_array ();
  unsigned char *ids = NULL;
  size_t nids = 0;
  uint64_t logical = 0, onchunks[2] = { 0, 0 };
  int status, ret;

  if ((status = repo_open_for (o, location, false, &r)) != 0)
    return status;
  s = repo_get_store (r);
  if ((status = disks_of (o, r, &disks, &ndisks)) != 0)
    goto out;
  status = EXIT_FAILED;
  for (size_t d = 0; d < ndisks; ++d) {
    long *runs;
    size_t nruns;
    json_t *jruns = json_array ();
    if ((ret = repo_list_runs (r, disks[d], &runs, &nruns)) < 0) {
      repo_fail (ret, NULL);
      json_decref (jruns);
      goto out;
    }
    if (!o->b.json)
      printf ("disk %s\n  %-6s %-20s %-11s %14s %14s  %-8s  %s\n", disks[d],
              "run", "time", "type", "size", "added", "verified", "GROUP");
    for (size_t i = 0; i < nruns; ++i) {
      struct repo_index *ix;
      json_t *meta, *ver = NULL, *jrun;
      char when[32], key[160];
      void *buf;
      size_t len;
      const char *verified = "-";

      snapfg_clear_error ();
      if ((ret = repo_index_load (r, disks[d], runs[i], &ix)) < 0) {
        backup_error ("%s", snapfg_get_error ());
        continue;
      }
      meta = repo_index_meta (ix);
      snprintf (key, sizeof key, "verify/%s/%08ld.json", disks[d], runs[i]);
      if (s->ops->get (s, key, &buf, &len) == 0) {
        ver = json_loadb (buf, len, 0, NULL);
        free (buf);
        verified = json_is_true (json_object_get (ver, "ok")) ? "ok"
                 : "DAMAGED";
      }
      tool_iso_time (json_integer_value (json_object_get (meta, "time")),
                     when);
      logical += repo_index_disk_size (ix);
      for (uint64_t n = 0; n < repo_index_chunks (ix); ++n)
        if (!repo_digest_is_zero (repo_index_digest (ix, n))) {
          if (nids % 4096 == 0)
            ids = realloc (ids, (nids + 4096) * REPO_DIGEST_LEN);
          memcpy (ids + nids++ * REPO_DIGEST_LEN, repo_index_digest (ix, n),
                  REPO_DIGEST_LEN);
        }
      if (!o->b.json)
        printf ("  %-6ld %-20s %-11s %14" PRIu64 " %14" PRIu64 "  %-8s  %s\n",
                runs[i], when, json_str (meta, "type") ?: "?",
                repo_index_disk_size (ix),
                json_u64 (meta, "bytes_added"), verified,
                json_str (meta, "group") ?: "-");
      jrun = json_pack ("{s:i, s:s, s:I, s:s?, s:I, s:I, s:I, s:s}",
                        "run", (int) runs[i],
                        "time", when,
                        "timestamp", (json_int_t) json_integer_value
                        (json_object_get (meta, "time")),
                        "type", json_str (meta, "type"),
                        "size", (json_int_t) repo_index_disk_size (ix),
                        "bytes_added", (json_int_t)
                        json_u64 (meta, "bytes_added"),
                        "bytes_read", (json_int_t)
                        json_u64 (meta, "bytes_read"),
                        "verified", verified);
      /* The runs taken at one instant with other disks' (a group). */
      if (jrun && json_str (meta, "group")) {
        json_object_set (jrun, "group", json_object_get (meta, "group"));
        if (json_object_get (meta, "group_disks"))
          json_object_set (jrun, "group_disks",
                           json_object_get (meta, "group_disks"));
        if (json_object_get (meta, "held_ms"))
          json_object_set (jrun, "held_ms", json_object_get (meta, "held_ms"));
      }
      json_array_append_new (jruns, jrun);
      json_decref (ver);
      repo_index_free (ix);
    }
    free (runs);
    json_array_append_new (jdisks, json_pack ("{s:s, s:o}", "disk", disks[d],
                                              "runs", jruns));
  }
  {
    size_t j = 0;
    if (nids) {
      qsort (ids, nids, REPO_DIGEST_LEN, cmp_id);
      for (size_t i = 0; i < nids; ++i)
        if (j == 0 || memcmp (ids + (j - 1) * REPO_DIGEST_LEN,
                              ids + i * REPO_DIGEST_LEN, REPO_DIGEST_LEN))
          j++;
    }
    nids = j;
  }
  s->ops->list (s, "chunks/", sum_chunk, onchunks);
  {
    uint64_t unique = nids * (uint64_t) repo_get_chunk_size (r);
    if (o->b.json)
      tool_json_result (json_pack ("{s:s, s:s, s:b, s:o, s:I, s:I, s:I, s:I}",
                                   "command", "list", "repository", location,
                                   "encrypted", repo_is_encrypted (r),
                                   "disks", json_incref (jdisks),
                                   "logical_bytes", (json_int_t) logical,
                                   "unique_bytes", (json_int_t) unique,
                                   "stored_bytes", (json_int_t) onchunks[1],
                                   "chunks", (json_int_t) onchunks[0]), 0);
    else
      printf ("logical %" PRIu64 " bytes, unique %" PRIu64 " bytes (%zu "
              "chunks%s), on disk %" PRIu64 " bytes (%" PRIu64 " chunks in "
              "the repository)\n", logical, unique, nids,
              o->disk ? " of this disk" : "", onchunks[1], onchunks[0]);
  }
  status = EXIT_OK;
 out:
  json_decref (jdisks);
  free (ids);
  repo_free_names (disks, ndisks);
  repo_close (r);
  return status;
}

/* --- prune --- */

int
repo_cmd_prune (struct repo_options *o, const char *location)
{
  struct repo *r = NULL;
  struct repo_store *s;
  char **disks = NULL;
  size_t ndisks = 0;
  json_t *jdisks = json_array ();
  uint64_t removed = 0;
  int status, ret;

  if ((status = repo_open_for (o, location, false, &r)) != 0)
    return status;
  s = repo_get_store (r);
  if ((status = disks_of (o, r, &disks, &ndisks)) != 0)
    goto out;
  status = EXIT_FAILED;
  for (size_t d = 0; d < ndisks; ++d) {
    long *runs;
    size_t nruns;
    struct repo_prune_run *pr;
    json_t *jruns = json_array ();

    if ((ret = repo_list_runs (r, disks[d], &runs, &nruns)) < 0) {
      repo_fail (ret, NULL);
      json_decref (jruns);
      goto out;
    }
    pr = calloc (nruns + 1, sizeof *pr);
    for (size_t i = 0; i < nruns; ++i) {
      struct repo_index *ix;
      snapfg_clear_error ();
      if ((ret = repo_index_load (r, disks[d], runs[i], &ix)) < 0) {
        /* Its time is unknown: prune nothing of this disk rather than
         * guess which runs the rules keep.
         */
        backup_error ("%s; prune of disk %s stopped", snapfg_get_error (),
                      disks[d]);
        free (pr);
        free (runs);
        json_decref (jruns);
        goto out;
      }
      pr[i].run = runs[i];
      pr[i].time = json_integer_value (json_object_get (repo_index_meta (ix),
                                                        "time"));
      repo_index_free (ix);
    }
    repo_prune_select (pr, nruns, o->keep);
    for (size_t i = 0; i < nruns; ++i) {
      char when[32];
      tool_iso_time (pr[i].time, when);
      if (!o->b.json)
        printf ("disk %s run %ld (%s): %s%s%s\n", disks[d], pr[i].run, when,
                pr[i].keep ? "keep" : o->dry_run ? "would remove" : "remove",
                pr[i].keep ? " " : "", pr[i].keep ? pr[i].reason : "");
      json_array_append_new (jruns, json_pack ("{s:i, s:s, s:b, s:s?}",
                                               "run", (int) pr[i].run,
                                               "time", when,
                                               "keep", pr[i].keep,
                                               "reason", pr[i].reason));
      if (!pr[i].keep && !o->dry_run) {
        char key[160];
        repo_index_key (disks[d], pr[i].run, key, sizeof key);
        snapfg_clear_error ();
        if ((ret = s->ops->del (s, key)) < 0 && ret != -ENOENT) {
          repo_fail (ret, NULL);
          free (pr);
          free (runs);
          json_decref (jruns);
          goto out;
        }
        snprintf (key, sizeof key, "verify/%s/%08ld.json", disks[d],
                  pr[i].run);
        s->ops->del (s, key);
        removed++;
      }
    }
    free (pr);
    free (runs);
    json_array_append_new (jdisks, json_pack ("{s:s, s:o}", "disk", disks[d],
                                              "runs", jruns));
  }
  if (o->b.json)
    tool_json_result (json_pack ("{s:s, s:s, s:b, s:I, s:o}",
                                 "command", "prune", "repository", location,
                                 "dry_run", o->dry_run,
                                 "removed", (json_int_t) removed,
                                 "disks", json_incref (jdisks)), 0);
  else if (!o->dry_run)
    printf ("snapfg-backup: %" PRIu64 " runs removed; their chunks go at the "
            "next gc\n", removed);
  status = EXIT_OK;
 out:
  json_decref (jdisks);
  repo_free_names (disks, ndisks);
  repo_close (r);
  return status;
}

/* --- gc --- */

#define DEFAULT_GRACE 3600

int
repo_cmd_gc (struct repo_options *o, const char *location)
{
  struct repo *r = NULL;
  struct repo_gc_result res;
  int status, ret;

  if ((status = repo_open_for (o, location, false, &r)) != 0)
    return status;
  snapfg_clear_error ();
  ret = repo_gc (r, o->grace >= 0 ? o->grace : DEFAULT_GRACE, o->dry_run,
                 &res);
  repo_close (r);
  if (ret < 0)
    return repo_fail (ret, "gc");
  if (o->b.json)
    tool_json_result (json_pack ("{s:s, s:s, s:b, s:I, s:I, s:I, s:I, s:I,"
                                 " s:I, s:I, s:I, s:I, s:I}",
                                 "command", "gc", "repository", location,
                                 "dry_run", o->dry_run,
                                 "indexes", (json_int_t) res.indexes,
                                 "referenced_chunks",
                                 (json_int_t) res.referenced,
                                 "missing_chunks", (json_int_t) res.missing,
                                 "chunks", (json_int_t) res.chunks,
                                 "removed_chunks", (json_int_t) res.removed,
                                 "removed_bytes",
                                 (json_int_t) res.removed_bytes,
                                 "kept_recent", (json_int_t) res.recent,
                                 "live_writers", (json_int_t) res.writers,
                                 "removed_partial",
                                 (json_int_t) res.partial,
                                 "cutoff", (json_int_t) res.cutoff), 0);
  else
    printf ("snapfg-backup: gc: %" PRIu64 " indexes reference %" PRIu64
            " chunks; %s %" PRIu64 " unreferenced chunks (%" PRIu64
            " bytes); kept %" PRIu64 " newer than the cutoff (%" PRIu64
            " running backups); %s %" PRIu64 " partial files of "
            "interrupted writes\n", res.indexes, res.referenced,
            o->dry_run ? "would remove" : "removed", res.removed,
            res.removed_bytes, res.recent, res.writers,
            o->dry_run ? "would remove" : "removed", res.partial);
  if (res.missing) {
    backup_error ("%" PRIu64 " chunks referenced by indexes are missing: "
                  "run verify --all, then back up the disks again",
                  res.missing);
    return EXIT_FAILED;
  }
  return EXIT_OK;
}
