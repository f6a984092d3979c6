/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: garbage collection, mark and sweep.
 *
 * Proxmox Backup's scheme, with the chunk's mtime for its atime: the
 * mark phase touches every chunk an index references; the sweep removes
 * a chunk only when no index references it and its mtime is older than
 * the cutoff.  A backup registers itself (writers/ID) before it
 * references any chunk that exists, and touches every chunk it
 * references (the ones its previous run's index names as well as those
 * it finds stored already), so each of them is newer than its start;
 * the cutoff is never later than the start of the oldest live writer.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>

#include "snapfg-error.h"
#include "repo-admin.h"
#include "repo-gc.h"
#include "repo-private.h"

struct idset {
  unsigned char *ids;
  size_t n, cap;
};

static int
idset_add (struct idset *s, const unsigned char *id)
{
  if (s->n == s->cap) {
    size_t cap = s->cap * 2 + 1024;
    unsigned char *p = realloc (s->ids, cap * REPO_DIGEST_LEN);
    if (p == NULL)
      return snapfg_set_error (ENOMEM, "out of memory");
    s->ids = p;
    s->cap = cap;
  }
  memcpy (s->ids + s->n++ * REPO_DIGEST_LEN, id, REPO_DIGEST_LEN);
  return 0;
}

static int
cmp_id (const void *a, const void *b)
{
  return memcmp (a, b, REPO_DIGEST_LEN);
}

static void
idset_sort_unique (struct idset *s)
{
  size_t j = 0;

  if (s->n > 1)
    qsort (s->ids, s->n, REPO_DIGEST_LEN, cmp_id);
  for (size_t i = 0; i < s->n; ++i)
    if (j == 0 || memcmp (s->ids + (j - 1) * REPO_DIGEST_LEN,
                          s->ids + i * REPO_DIGEST_LEN, REPO_DIGEST_LEN))
      memmove (s->ids + j++ * REPO_DIGEST_LEN, s->ids + i * REPO_DIGEST_LEN,
               REPO_DIGEST_LEN);
  s->n = j;
}

static bool
idset_has (const struct idset *s, const unsigned char *id)
{
  return bsearch (id, s->ids, s->n, REPO_DIGEST_LEN, cmp_id) != NULL;
}

struct sweep {
  struct repo *r;
  struct idset *marked;
  struct idset candidates;
  struct repo_gc_result *res;
};

static int
chunk_seen (void *opaque, const struct repo_object_info *info)
{
  struct sweep *sw = opaque;
  const char *hex = strrchr (info->key, '/');
  unsigned char id[REPO_DIGEST_LEN];

  if (hex == NULL || repo_unhex (hex + 1, id, sizeof id) == -1)
    return 0;                   /* not a chunk: left alone */
  sw->res->chunks++;
  sw->res->chunk_bytes += info->size;
  if (idset_has (sw->marked, id))
    return 0;
  if (info->mtime >= sw->res->cutoff) {
    sw->res->recent++;
    return 0;
  }
  return idset_add (&sw->candidates, id);
}

static int
remove_stale_writer (void *opaque, const struct repo_object_info *info)
{
  struct repo_store *s = opaque;

  if (info->mtime < time (NULL) - 4 * repo_writer_stale_seconds ())
    s->ops->del (s, info->key);
  return 0;
}

int
repo_gc (struct repo *r, int64_t grace, bool dry_run,
         struct repo_gc_result *res)
{
  struct repo_store *s = r->store;
  int64_t start = time (NULL), oldest;
  struct idset marked = { 0 };
  struct sweep sw = { .r = r, .marked = &marked, .res = res };
  char **disks = NULL;
  size_t ndisks = 0, nwriters;
  int ret;

  memset (res, 0, sizeof *res);
  /* The writers first: one that registers after this look made its
   * registration, and so touches its chunks, after start.
   */
  if ((ret = repo_live_writers (r, &nwriters, &oldest, NULL)) < 0)
    return ret;
  res->writers = nwriters;
  res->cutoff = (oldest < start ? oldest : start) - grace;
  /* Registrations of writers that crashed long ago are not kept. */
  if (!dry_run)
    s->ops->list (s, "writers/", remove_stale_writer, s);

  /* Mark. */
  if ((ret = repo_list_disks (r, &disks, &ndisks)) < 0)
    return ret;
  for (size_t d = 0; d < ndisks && ret == 0; ++d) {
    long *runs;
    size_t nruns;
    if ((ret = repo_list_runs (r, disks[d], &runs, &nruns)) < 0)
      break;
    for (size_t i = 0; i < nruns && ret == 0; ++i) {
      struct repo_index *ix;
      if ((ret = repo_index_load (r, disks[d], runs[i], &ix)) < 0) {
        /* An index that vanished was pruned meanwhile: it references
         * nothing any more.  One that cannot be read might reference
         * anything: stop.
         */
        if (ret == -ENOENT) {
          ret = 0;
          continue;
        }
        snapfg_set_error (-ret, "%s; gc removed nothing (fix or remove "
                          "that index first)", snapfg_get_error ());
        break;
      }
      res->indexes++;
      for (uint64_t n = 0; n < ix->nchunks && ret == 0; ++n)
        if (!repo_digest_is_zero (ix->digests + n * REPO_DIGEST_LEN))
          ret = idset_add (&marked, ix->digests + n * REPO_DIGEST_LEN);
      repo_index_free (ix);
    }
    free (runs);
  }
  repo_free_names (disks, ndisks);
  if (ret < 0)
    goto out;
  idset_sort_unique (&marked);
  res->referenced = marked.n;
  for (size_t i = 0; i < marked.n; ++i) {
    char key[REPO_CHUNK_KEY_LEN];
    int t;
    repo_chunk_key (marked.ids + i * REPO_DIGEST_LEN, key);
    t = s->ops->touch (s, key);
    if (t == -ENOENT)
      res->missing++;
    else if (t < 0) {
      ret = t;
      goto out;
    }
  }

  /* Sweep. */
  if ((ret = s->ops->list (s, "chunks/", chunk_seen, &sw)) < 0)
    goto out;
  for (size_t i = 0; i < sw.candidates.n; ++i) {
    const unsigned char *id = sw.candidates.ids + i * REPO_DIGEST_LEN;
    char key[REPO_CHUNK_KEY_LEN], dkey[REPO_CHUNK_KEY_LEN];
    struct repo_object_info info;

    repo_chunk_key (id, key);
    /* Its mtime again, right before it goes: a writer that found it
     * since the listing has touched it.
     */
    if (s->ops->head (s, key, &info) < 0 || info.mtime >= res->cutoff)
      continue;
    res->removed++;
    res->removed_bytes += info.size;
    if (dry_run)
      continue;
    if ((ret = s->ops->del (s, key)) < 0 && ret != -ENOENT)
      goto out;
    ret = 0;
    repo_damaged_key (id, dkey);
    s->ops->del (s, dkey);
  }
  /* What crashed puts left: a put still going belongs to a live writer,
   * so its file is newer than the cutoff.
   */
  if (s->ops->clean_partial &&
      (ret = s->ops->clean_partial (s, res->cutoff, dry_run,
                                    &res->partial)) < 0)
    goto out;
 out:
  free (marked.ids);
  free (sw.candidates.ids);
  return ret;
}
