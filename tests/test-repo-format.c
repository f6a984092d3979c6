/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* The repository library without a server: chunk objects (plain, zstd,
 * AES-256-GCM) round trip and refuse every kind of damage; ids are keyed
 * when encrypted; the directory back end's put if_absent, get, head,
 * touch, del, list and key rule; an index committed and loaded back,
 * damage refused; a wrong key refused at open; prune's rules.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#include "unit-test.h"
#include "repo-admin.h"
#include "repo-retention.h"

#define CS (4u << 20)

static void
fill (unsigned char *p, size_t n, unsigned seed)
{
  for (size_t i = 0; i < n; ++i)
    p[i] = (i % 4096 < 2048) ? (unsigned char) (i * 7 + seed) : 'x';
}

static void
test_chunks (void)
{
  struct repo_keys none = { .encrypted = false }, k1, k2;
  unsigned char *plain = malloc (CS), *out = malloc (CS);
  unsigned char sha[32], id[32], id1[32], id2[32];
  size_t len, plen;
  void *obj;

  fill (plain, CS, 1);
  repo_sha256 (plain, CS - 100, sha);
  CHECK (repo_keys_derive ("secret", 6, (const unsigned char *) "salt", 4,
                           1000, &k1) == 0);
  CHECK (repo_keys_derive ("secret2", 7, (const unsigned char *) "salt", 4,
                           1000, &k2) == 0);
  repo_chunk_id (&none, sha, id);
  CHECK (memcmp (id, sha, 32) == 0);
  repo_chunk_id (&k1, sha, id1);
  repo_chunk_id (&k2, sha, id2);
  CHECK (memcmp (id1, sha, 32) != 0 && memcmp (id1, id2, 32) != 0);

  for (int level = 0; level <= 1; ++level) {
    for (int e = 0; e <= 1; ++e) {
      struct repo_keys *k = e ? &k1 : &none;
      unsigned char *cid = e ? id1 : id;
      unsigned char *o;

      CHECK (repo_chunk_encode (k, cid, plain, CS - 100, level, &obj,
                                &len) == 0);
      o = obj;
      if (level)
        CHECK (len < CS / 2);                 /* half of it is 'x' */
      CHECK (repo_chunk_decode (k, cid, obj, len, out, CS, &plen, "t") == 0);
      CHECK (plen == CS - 100 && memcmp (out, plain, plen) == 0);
      CHECK (out[CS - 1] == 0);               /* padded */
      /* Every byte flipped somewhere is refused. */
      for (size_t at = 0; at < len; at += len / 7 + 1) {
        o[at] ^= 0x20;
        CHECK (repo_chunk_decode (k, cid, obj, len, out, CS, &plen, "t")
               == -EIO);
        o[at] ^= 0x20;
      }
      CHECK (repo_chunk_decode (k, cid, obj, len - 1, out, CS, &plen, "t")
             == -EIO);
      /* Another id, another key, no key. */
      CHECK (repo_chunk_decode (k, e ? id2 : id1, obj, len, out, CS, &plen,
                                "t") == -EIO);
      CHECK (repo_chunk_decode (e ? &k2 : &k1, cid, obj, len, out, CS, &plen,
                                "t") == -EIO);
      if (e) {
        CHECK (repo_chunk_decode (&none, cid, obj, len, out, CS, &plen, "t")
               == -EIO);
        /* No plain text in an encrypted object. */
        CHECK (memmem (obj, len, "xxxxxxxxxxxxxxxx", 16) == NULL);
      }
      free (obj);
    }
  }
  free (plain);
  free (out);
}

static int
count_fn (void *opaque, const struct repo_object_info *info)
{
  (*(int *) opaque)++;
  return 0;
}

static void
test_dir_store (const char *dir)
{
  struct repo_store *s;
  struct repo_object_info info;
  void *buf;
  size_t len;
  int n = 0;

  CHECK (repo_store_open (dir, NULL, true, &s) == 0);
  CHECK (strcmp (s->ops->name, "directory") == 0);
  CHECK (s->ops->put (s, "a/b/c", "one", 3, true) == 0);
  CHECK (s->ops->put (s, "a/b/c", "two", 3, true) == -EEXIST);
  CHECK (s->ops->get (s, "a/b/c", &buf, &len) == 0);
  CHECK (len == 3 && memcmp (buf, "one", 3) == 0);
  free (buf);
  CHECK (s->ops->put (s, "a/b/c", "three", 5, false) == 0);
  CHECK (s->ops->head (s, "a/b/c", &info) == 0 && info.size == 5);
  CHECK (s->ops->touch (s, "a/b/c") == 0);
  CHECK (s->ops->touch (s, "a/b/none") == -ENOENT);
  CHECK (s->ops->head (s, "a/none", &info) == -ENOENT);
  CHECK (s->ops->get (s, "none", &buf, &len) == -ENOENT);
  CHECK (s->ops->put (s, "a/d", "x", 1, false) == 0);
  CHECK (s->ops->put (s, "ab", "x", 1, false) == 0);
  CHECK (s->ops->list (s, "a/", count_fn, &n) == 0 && n == 2);
  n = 0;
  CHECK (s->ops->list (s, "a", count_fn, &n) == 0 && n == 3);
  n = 0;
  CHECK (s->ops->list (s, "zz/", count_fn, &n) == 0 && n == 0);
  CHECK (s->ops->del (s, "a/d") == 0);
  CHECK (s->ops->del (s, "a/d") == -ENOENT);
  /* Keys that could leave the store, or are not keys. */
  CHECK (s->ops->put (s, "../x", "x", 1, false) == -EINVAL);
  CHECK (s->ops->put (s, "a/../../x", "x", 1, false) == -EINVAL);
  CHECK (s->ops->put (s, "/abs", "x", 1, false) == -EINVAL);
  CHECK (s->ops->put (s, "a//b", "x", 1, false) == -EINVAL);
  CHECK (s->ops->put (s, "a/b c", "x", 1, false) == -EINVAL);
  CHECK (s->ops->get (s, "", &buf, &len) == -EINVAL);
  s->ops->close (s);
  CHECK (repo_store_open ("s3://bucket/x", NULL, false, &s) < 0);
}

static void
test_repo (const char *dir, const char *keyfile, const char *badkey)
{
  struct repo *r;
  struct repo_index *ix, *back;
  json_t *config;
  unsigned char *data = malloc (CS);
  unsigned char sha[32];
  uint64_t stored;
  long run;
  char key[128];

  CHECK (repo_init (dir, NULL, true, keyfile, &config) == 0);
  json_decref (config);
  CHECK (repo_init (dir, NULL, true, keyfile, &config) == -EEXIST);
  CHECK (repo_exists (dir, NULL) == 1);
  CHECK (repo_open (dir, NULL, badkey, &r) == -EACCES);
  CHECK (repo_open (dir, NULL, NULL, &r) == 0);
  CHECK (repo_is_encrypted (r) && !repo_has_key (r));
  repo_close (r);
  CHECK (repo_open (dir, NULL, keyfile, &r) == 0);
  CHECK (repo_has_key (r) && repo_get_chunk_size (r) == CS);

  fill (data, CS, 3);
  repo_sha256 (data, CS, sha);
  CHECK (repo_index_new ("disk-1", CS * 2 + 512, CS, &ix) == 0);
  CHECK (repo_index_chunks (ix) == 3);
  repo_chunk_id (repo_get_keys (r), sha, repo_index_digest (ix, 1));
  CHECK (repo_put_chunk (r, repo_index_digest (ix, 1), data, 0, CS, 1, false,
                         &stored) == 0 && stored > 0);
  CHECK (repo_put_chunk (r, repo_index_digest (ix, 1), data, 0, CS, 1, false,
                         &stored) == 1 && stored == 0);
  CHECK (repo_index_commit (r, ix, &run) == 0 && run == 1);
  CHECK (repo_index_commit (r, ix, &run) == 0 && run == 2);
  CHECK (repo_index_load (r, "disk-1", 0, &back) == 0);
  CHECK (repo_index_run (back) == 2 && repo_index_disk_size (back) ==
         CS * 2 + 512);
  CHECK (repo_index_chunk_is_zero (back, 0) && !repo_index_chunk_is_zero (back, 1));
  {
    unsigned char *out = malloc (CS);
    CHECK (repo_read_chunk (r, back, 1, out) == 0 && memcmp (out, data, CS) == 0);
    CHECK (repo_read_chunk (r, back, 0, out) == 0 && out[0] == 0);
    free (out);
  }
  repo_index_free (back);
  /* A flipped byte in an index is refused. */
  repo_index_key ("disk-1", 1, key, sizeof key);
  {
    char path[8192];
    int fd;
    unsigned char b;
    snprintf (path, sizeof path, "%s/%s", dir, key);
    fd = open (path, O_RDWR);
    CHECK (fd >= 0 && pread (fd, &b, 1, 20) == 1);
    b ^= 1;
    CHECK (pwrite (fd, &b, 1, 20) == 1);
    close (fd);
  }
  CHECK (repo_index_load (r, "disk-1", 1, &back) == -EIO);
  CHECK (repo_index_load (r, "no/disk", 1, &back) == -EINVAL);
  CHECK (repo_index_load (r, "disk-2", 0, &back) == -ENOENT);
  repo_index_free (ix);
  repo_close (r);
  free (data);
}

static void
test_retention (void)
{
  /* 2026-01-01 10:00, 10:30, 11:00, 01-02 09:00, 01-08 09:00,
   * 02-01 09:00, 09:10 (UTC).
   */
  static const int64_t t[] = { 1767261600, 1767263400, 1767265200,
                               1767344400, 1767862800, 1769936400,
                               1769937000 };
  struct repo_prune_run runs[7];
  long keep[REPO_KEEP_N] = { 0 };
  char got[64];

  setenv ("TZ", "UTC", 1);
  for (int i = 0; i < 7; ++i)
    runs[i] = (struct repo_prune_run) { .run = i + 1, .time = t[i] };
#define KEPT(...) do {                                                 \
    long k_[REPO_KEEP_N] = __VA_ARGS__;                                \
    size_t o_ = 0;                                                     \
    repo_prune_select (runs, 7, k_);                                   \
    got[0] = '\0';                                                     \
    for (int i = 0; i < 7; ++i)                                        \
      if (runs[i].keep)                                                \
        o_ += snprintf (got + o_, sizeof got - o_, "%ld ", runs[i].run); \
  } while (0)
  KEPT ({ 1, 0, 2, 0, 2, 0 });
  CHECK (strcmp (got, "4 5 7 ") == 0);
  KEPT ({ 0, 4, 0, 0, 0, 0 });
  CHECK (strcmp (got, "3 4 5 7 ") == 0);
  KEPT ({ 0, 0, 0, 5, 0, 0 });
  CHECK (strcmp (got, "4 5 7 ") == 0);
  KEPT ({ 3, 3, 1, 0, 0, 0 });
  CHECK (strcmp (got, "2 3 4 5 6 7 ") == 0);
  KEPT ({ 0, 0, 0, 0, 0, 0 });
  CHECK (strcmp (got, "1 2 3 4 5 6 7 ") == 0);
  (void) keep;
}

int
main (void)
{
  char dir[] = "/tmp/test-repo-format.XXXXXX", path[4200];
  char key[4200], bad[4200];
  int fd;

  CHECK (mkdtemp (dir) != NULL);
  test_chunks ();
  snprintf (path, sizeof path, "%s/store", dir);
  test_dir_store (path);
  snprintf (key, sizeof key, "%s/key", dir);
  snprintf (bad, sizeof bad, "%s/bad", dir);
  fd = open (key, O_WRONLY | O_CREAT | O_EXCL, 0600);
  CHECK (fd >= 0 && write (fd, "k1", 2) == 2);
  close (fd);
  fd = open (bad, O_WRONLY | O_CREAT | O_EXCL, 0600);
  CHECK (fd >= 0 && write (fd, "k2", 2) == 2);
  close (fd);
  snprintf (path, sizeof path, "%s/repo", dir);
  test_repo (path, key, bad);
  test_retention ();
  snprintf (path, sizeof path, "rm -rf '%s'", dir);
  if (system (path) != 0)
    fprintf (stderr, "could not remove %s\n", dir);
  printf ("test-repo-format: PASS\n");
  return 0;
}
