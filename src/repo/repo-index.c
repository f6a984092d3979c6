/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: run indexes, one per run of a disk, each a full
 * point: the disk's size, chunk size, every chunk's id, the run's
 * metadata, a checksum (and in an encrypted repository a MAC).  The
 * format is docs/repository.md, "Indexes".
 *
 * A run's index is the last object it writes, so a crashed run leaves
 * nothing that a restore or a later run trusts: only chunks, which gc
 * removes.  Its number is taken by writing it with put if_absent.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>

#include <gnutls/gnutls.h>

#include "byte-order.h"
#include "cleanup.h"
#include "snapfg-error.h"
#include "repo-admin.h"
#include "repo-private.h"

#define INDEX_MAGIC "SFGIDX01"
#define INDEX_META_MAX (1 << 20)
#define RUN_MAX 99999999L

bool
repo_disk_name_ok (const char *name)
{
  size_t n = name ? strlen (name) : 0;

  if (n == 0 || n > REPO_DISK_NAME_MAX || name[0] == '.')
    return false;
  for (size_t i = 0; i < n; ++i) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  }
  return true;
}

void
repo_index_key (const char *disk, long run, char *key, size_t len)
{
  snprintf (key, len, "index/%s/%08ld.idx", disk, run);
}

int
repo_index_new (const char *disk, uint64_t disk_size, uint32_t chunk_size,
                struct repo_index **ixp)
{
  struct repo_index *ix = calloc (1, sizeof *ix);

  *ixp = NULL;
  if (ix == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  ix->disk = strdup (disk);
  ix->disk_size = disk_size;
  ix->chunk_size = chunk_size;
  ix->nchunks = (disk_size + chunk_size - 1) / chunk_size;
  ix->digests = calloc (ix->nchunks ? ix->nchunks : 1, REPO_DIGEST_LEN);
  ix->meta = json_object ();
  if (ix->disk == NULL || ix->digests == NULL || ix->meta == NULL) {
    repo_index_free (ix);
    return snapfg_set_error (ENOMEM, "out of memory for the index of a "
                             "disk of %" PRIu64 " bytes", disk_size);
  }
  *ixp = ix;
  return 0;
}

void
repo_index_free (struct repo_index *ix)
{
  if (ix == NULL)
    return;
  free (ix->disk);
  free (ix->digests);
  json_decref (ix->meta);
  free (ix);
}

uint64_t repo_index_disk_size (const struct repo_index *ix) { return ix->disk_size; }
uint32_t repo_index_chunk_size (const struct repo_index *ix) { return ix->chunk_size; }
long repo_index_run (const struct repo_index *ix) { return ix->run; }
uint64_t repo_index_chunks (const struct repo_index *ix) { return ix->nchunks; }
json_t *repo_index_meta (struct repo_index *ix) { return ix->meta; }
const char *repo_index_disk (const struct repo_index *ix) { return ix->disk; }

unsigned char *
repo_index_digest (struct repo_index *ix, uint64_t n)
{
  return ix->digests + n * REPO_DIGEST_LEN;
}

bool
repo_index_chunk_is_zero (const struct repo_index *ix, uint64_t n)
{
  return n >= ix->nchunks ||
    repo_digest_is_zero (ix->digests + n * REPO_DIGEST_LEN);
}

/* The index object: magic, metadata length, metadata (JSON), chunk
 * count, ids, SHA-256 of all that, and with a key its HMAC.
 */
static int
index_serialize (struct repo *r, struct repo_index *ix, unsigned char **out,
                 size_t *out_len)
{
  CLEANUP_FREE char *meta = NULL;
  size_t mlen, len;
  unsigned char *buf, *p;

  json_object_set_new (ix->meta, "format", json_string ("snapfg-repo-index"));
  json_object_set_new (ix->meta, "version", json_integer (1));
  json_object_set_new (ix->meta, "disk", json_string (ix->disk));
  json_object_set_new (ix->meta, "run", json_integer (ix->run));
  json_object_set_new (ix->meta, "disk_size", json_integer (ix->disk_size));
  json_object_set_new (ix->meta, "chunk_size", json_integer (ix->chunk_size));
  json_object_set_new (ix->meta, "repository", json_string (r->id));
  meta = json_dumps (ix->meta, JSON_COMPACT | JSON_SORT_KEYS);
  if (meta == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  mlen = strlen (meta);
  len = 8 + 4 + mlen + 8 + ix->nchunks * REPO_DIGEST_LEN + REPO_DIGEST_LEN +
    (r->encrypted ? REPO_DIGEST_LEN : 0);
  buf = p = malloc (len);
  if (buf == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  memcpy (p, INDEX_MAGIC, 8);
  p += 8;
  put_le32 (p, mlen);
  p += 4;
  memcpy (p, meta, mlen);
  p += mlen;
  put_le64 (p, ix->nchunks);
  p += 8;
  memcpy (p, ix->digests, ix->nchunks * REPO_DIGEST_LEN);
  p += ix->nchunks * REPO_DIGEST_LEN;
  repo_sha256 (buf, p - buf, p);
  p += REPO_DIGEST_LEN;
  if (r->encrypted) {
    repo_hmac (r->keys.mac, buf, p - buf, p);
    p += REPO_DIGEST_LEN;
  }
  *out = buf;
  *out_len = len;
  return 0;
}

static int
index_parse (struct repo *r, const char *key, const unsigned char *buf,
             size_t len, struct repo_index **ixp)
{
  const unsigned char *p = buf, *end = buf + len;
  unsigned char d[REPO_DIGEST_LEN];
  struct repo_index *ix;
  json_t *meta;
  uint32_t mlen;
  uint64_t n, size;
  json_int_t cs;
  const char *disk;
  size_t trailer = REPO_DIGEST_LEN + (r->encrypted ? REPO_DIGEST_LEN : 0);
  int ret;

#define BAD(why) snapfg_set_error (EIO, "%s/%s: %s: the index is damaged " \
                                   "or not an index", r->location, key, why)
  if (len < 8 + 4 + 8 + trailer || memcmp (p, INDEX_MAGIC, 8) != 0)
    return BAD ("bad header");
  p += 8;
  mlen = get_le32 (p);
  p += 4;
  if (mlen > INDEX_META_MAX || (size_t) (end - p) < mlen + 8 + trailer)
    return BAD ("truncated metadata");
  p += mlen;
  n = get_le64 (p);
  p += 8;
  if (n > (end - p - trailer) / REPO_DIGEST_LEN ||
      (size_t) (end - p) != n * REPO_DIGEST_LEN + trailer)
    return BAD ("its length does not match its chunk count");
  repo_sha256 (buf, end - buf - trailer, d);
  if (memcmp (d, end - trailer, REPO_DIGEST_LEN) != 0)
    return BAD ("its checksum does not match");
  if (r->encrypted && r->keys.encrypted) {
    repo_hmac (r->keys.mac, buf, end - buf - REPO_DIGEST_LEN, d);
    if (gnutls_memcmp (d, end - REPO_DIGEST_LEN, REPO_DIGEST_LEN) != 0)
      return BAD ("its MAC does not match the key (tampered with)");
  }
  meta = json_loadb ((const char *) buf + 12, mlen, 0, NULL);
  size = json_integer_value (json_object_get (meta, "disk_size"));
  cs = json_integer_value (json_object_get (meta, "chunk_size"));
  disk = json_string_value (json_object_get (meta, "disk"));
  if (meta == NULL || disk == NULL || cs < 65536 || (cs & (cs - 1)) ||
      (size + cs - 1) / cs != n ||
      json_integer_value (json_object_get (meta, "run")) < 1) {
    json_decref (meta);
    return BAD ("bad metadata");
  }
#undef BAD
  if ((ret = repo_index_new (disk, size, cs, &ix)) < 0) {
    json_decref (meta);
    return ret;
  }
  json_decref (ix->meta);
  ix->meta = meta;
  ix->run = json_integer_value (json_object_get (meta, "run"));
  memcpy (ix->digests, p, n * REPO_DIGEST_LEN);
  *ixp = ix;
  return 0;
}

struct runs_scan {
  const char *prefix;
  long *runs;
  size_t n, cap;
};

static int
run_seen (void *opaque, const struct repo_object_info *info)
{
  struct runs_scan *rs = opaque;
  const char *name = info->key + strlen (rs->prefix);
  char *end;
  long run;

  if (strlen (name) != 12 || strcmp (name + 8, ".idx") != 0)
    return 0;
  run = strtol (name, &end, 10);
  if (end != name + 8 || run < 1)
    return 0;
  if (rs->n == rs->cap) {
    long *p = realloc (rs->runs, (rs->cap = rs->cap * 2 + 16) * sizeof *p);
    if (p == NULL)
      return snapfg_set_error (ENOMEM, "out of memory");
    rs->runs = p;
  }
  rs->runs[rs->n++] = run;
  return 0;
}

static int
cmp_long (const void *a, const void *b)
{
  long x = *(const long *) a, y = *(const long *) b;
  return x < y ? -1 : x > y;
}

int
repo_list_runs (struct repo *r, const char *disk, long **runs, size_t *n)
{
  char prefix[128];
  struct runs_scan rs = { .prefix = prefix };
  int ret;

  *runs = NULL;
  *n = 0;
  if (!repo_disk_name_ok (disk))
    return snapfg_set_error (EINVAL, "--disk %s: a disk's name is 1 to %d "
                             "of A-Z a-z 0-9 . _ - (not starting with .)",
                             disk, REPO_DISK_NAME_MAX);
  snprintf (prefix, sizeof prefix, "index/%s/", disk);
  ret = r->store->ops->list (r->store, prefix, run_seen, &rs);
  if (ret < 0) {
    free (rs.runs);
    return ret;
  }
  if (rs.n > 1)
    qsort (rs.runs, rs.n, sizeof *rs.runs, cmp_long);
  *runs = rs.runs;
  *n = rs.n;
  return 0;
}

struct disks_scan {
  char **names;
  size_t n, cap;
};

static int
disk_seen (void *opaque, const struct repo_object_info *info)
{
  struct disks_scan *ds = opaque;
  const char *name = info->key + 6, *slash = strchr (name, '/');
  char disk[REPO_DISK_NAME_MAX + 1];

  if (slash == NULL || (size_t) (slash - name) > REPO_DISK_NAME_MAX)
    return 0;
  memcpy (disk, name, slash - name);
  disk[slash - name] = '\0';
  if (!repo_disk_name_ok (disk))
    return 0;
  for (size_t i = 0; i < ds->n; ++i)
    if (strcmp (ds->names[i], disk) == 0)
      return 0;
  if (ds->n == ds->cap) {
    char **p = realloc (ds->names, (ds->cap = ds->cap * 2 + 8) * sizeof *p);
    if (p == NULL)
      return snapfg_set_error (ENOMEM, "out of memory");
    ds->names = p;
  }
  if ((ds->names[ds->n] = strdup (disk)) == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  ds->n++;
  return 0;
}

static int
cmp_str (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

int
repo_list_disks (struct repo *r, char ***disks, size_t *n)
{
  struct disks_scan ds = { 0 };
  int ret = r->store->ops->list (r->store, "index/", disk_seen, &ds);

  if (ret < 0) {
    repo_free_names (ds.names, ds.n);
    return ret;
  }
  if (ds.n > 1)
    qsort (ds.names, ds.n, sizeof *ds.names, cmp_str);
  *disks = ds.names;
  *n = ds.n;
  return 0;
}

void
repo_free_names (char **names, size_t n)
{
  for (size_t i = 0; i < n; ++i)
    free (names[i]);
  free (names);
}

int
repo_index_load (struct repo *r, const char *disk, long at,
                 struct repo_index **ixp)
{
  char key[128];
  void *buf;
  size_t len;
  int ret;

  *ixp = NULL;
  if (!repo_disk_name_ok (disk))
    return snapfg_set_error (EINVAL, "--disk %s: not a disk name (1 to %d "
                             "of A-Z a-z 0-9 . _ -)", disk,
                             REPO_DISK_NAME_MAX);
  if (at <= 0) {
    long *runs;
    size_t n;
    if ((ret = repo_list_runs (r, disk, &runs, &n)) < 0)
      return ret;
    at = n ? runs[n - 1] : 0;
    free (runs);
    if (at == 0)
      return snapfg_set_error (ENOENT, "%s: no run of disk %s", r->location,
                               disk);
  }
  repo_index_key (disk, at, key, sizeof key);
  ret = r->store->ops->get (r->store, key, &buf, &len);
  if (ret == -ENOENT)
    return snapfg_set_error (ENOENT, "%s: disk %s has no run %ld",
                             r->location, disk, at);
  if (ret < 0)
    return ret;
  ret = index_parse (r, key, buf, len, ixp);
  free (buf);
  if (ret < 0)
    return ret;
  if ((*ixp)->run != at || strcmp ((*ixp)->disk, disk) != 0) {
    long says = (*ixp)->run;
    char *says_disk = strdup ((*ixp)->disk);
    repo_index_free (*ixp);
    *ixp = NULL;
    ret = snapfg_set_error (EIO, "%s/%s: says it is run %ld of disk %s: "
                            "not where it belongs (moved or tampered "
                            "with)", r->location, key, says,
                            says_disk ? says_disk : "?");
    free (says_disk);
    return ret;
  }
  return 0;
}

int
repo_index_commit (struct repo *r, struct repo_index *ix, long *run)
{
  long *runs;
  size_t n;
  int ret;

  /* Never an index naming a chunk still in the store's batch. */
  if ((ret = repo_sync (r)) < 0)
    return ret;
  if ((ret = repo_list_runs (r, ix->disk, &runs, &n)) < 0)
    return ret;
  ix->run = n ? runs[n - 1] + 1 : 1;
  free (runs);
  for (;; ix->run++) {
    unsigned char *buf = NULL;
    size_t len = 0;
    char key[128];

    if (ix->run > RUN_MAX)
      return snapfg_set_error (EOVERFLOW, "disk %s: no run number left",
                               ix->disk);
    if ((ret = index_serialize (r, ix, &buf, &len)) < 0)
      return ret;
    repo_index_key (ix->disk, ix->run, key, sizeof key);
    ret = r->store->ops->put (r->store, key, buf, len, true);
    free (buf);
    if (ret != -EEXIST)
      break;
    /* Another run of this disk took the number: the next one. */
  }
  if (ret < 0)
    return ret;
  *run = ix->run;
  return 0;
}

int
repo_read_chunk (struct repo *r, const struct repo_index *ix, uint64_t n,
                 void *buf)
{
  if (n >= ix->nchunks)
    return snapfg_set_error (EINVAL, "chunk %" PRIu64 " is past the end of "
                             "disk %s (%" PRIu64 " chunks)", n, ix->disk,
                             ix->nchunks);
  if (ix->chunk_size != r->chunk_size)
    return snapfg_set_error (EINVAL, "run %ld of disk %s has chunks of %u "
                             "bytes, the repository %u", ix->run, ix->disk,
                             ix->chunk_size, r->chunk_size);
  if (repo_index_chunk_is_zero (ix, n)) {
    memset (buf, 0, ix->chunk_size);
    return 0;
  }
  return repo_read_chunk_id (r, ix->digests + n * REPO_DIGEST_LEN, buf);
}
