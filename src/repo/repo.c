/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: the config object, opening (the key checked first),
 * chunks, writers' registrations.  The format is docs/repository.md.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <gnutls/gnutls.h>
#include <gnutls/crypto.h>
#include <zstd.h>

#include "big-buffer.h"
#include "cleanup.h"
#include "full-io.h"
#include "random-uuid.h"
#include "snapfg-error.h"
#include "repo-admin.h"
#include "repo-private.h"

#define CONFIG_FORMAT "snapfg-repository"
#define KDF_ITERATIONS 200000
#define KEY_FILE_MAX 65536

int64_t
repo_run_time (void)
{
  const char *t = getenv ("SNAPFG_BACKUP_TEST_TIME");

  if (t && *t)
    return strtoll (t, NULL, 10);
  return time (NULL);
}

/* The key file's bytes (at most 64 KiB, at least one). */
static int
read_key_file (const char *path, unsigned char **buf, size_t *len)
{
  CLEANUP_CLOSE int fd = open (path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  ssize_t n;

  if (fd == -1)
    return snapfg_set_error (errno, "--key-file %s: %s", path,
                             strerror (errno));
  if (fstat (fd, &st) == 0 && S_ISREG (st.st_mode) && (st.st_mode & 077))
    fprintf (stderr, "snapfg-backup: warning: --key-file %s can be read by "
             "others (mode %04o): chmod 600 it\n", path,
             (unsigned) (st.st_mode & 07777));
  *buf = malloc (KEY_FILE_MAX + 1);
  if (*buf == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  n = read (fd, *buf, KEY_FILE_MAX + 1);
  if (n <= 0 || n > KEY_FILE_MAX) {
    int e = n < 0 ? errno : EINVAL;
    free (*buf);
    *buf = NULL;
    return snapfg_set_error (e, "--key-file %s: %s", path,
                             n < 0 ? strerror (e) : n == 0 ? "empty"
                             : "longer than 64 KiB: not a key file");
  }
  *len = n;
  return 0;
}

/* The canonical text of the config that its checksum and MAC cover:
 * every member but those two, sorted, compact.
 */
static char *
config_canonical (json_t *config)
{
  json_t *c = json_deep_copy (config);
  char *s;

  if (c == NULL)
    return NULL;
  json_object_del (c, "checksum");
  json_object_del (c, "mac");
  s = json_dumps (c, JSON_SORT_KEYS | JSON_COMPACT);
  json_decref (c);
  return s;
}

static int
config_seal (json_t *config, const struct repo_keys *k)
{
  CLEANUP_FREE char *text = config_canonical (config);
  unsigned char d[REPO_DIGEST_LEN];
  char hex[2 * REPO_DIGEST_LEN + 1];

  if (text == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  repo_sha256 (text, strlen (text), d);
  repo_hex (d, sizeof d, hex);
  json_object_set_new (config, "checksum", json_string (hex));
  if (k && k->encrypted) {
    repo_hmac (k->mac, text, strlen (text), d);
    repo_hex (d, sizeof d, hex);
    json_object_set_new (config, "mac", json_string (hex));
  }
  return 0;
}

int
repo_init (const char *location, const struct repo_s3_options *s3,
           bool encrypt, const char *key_file, json_t **configp)
{
  struct repo_store *s;
  struct repo_keys k = { .encrypted = false };
  json_t *config;
  char id[RANDOM_UUID_LEN + 1], hex[2 * REPO_DIGEST_LEN + 1];
  unsigned char salt[32];
  char *text;
  int r;

  *configp = NULL;
  if (encrypt && key_file == NULL)
    return snapfg_set_error (EINVAL, "--encrypt: give the key with "
                             "--key-file FILE");
  if (!encrypt && key_file)
    return snapfg_set_error (EINVAL, "--key-file without --encrypt: an "
                             "unencrypted repository has no key (add "
                             "--encrypt)");
  random_uuid (id);
  config = json_pack ("{s:s, s:i, s:s, s:i, s:I, s:s}",
                      "format", CONFIG_FORMAT, "version", 1,
                      "id", id, "chunk_size", (int) REPO_CHUNK_SIZE,
                      "created", (json_int_t) time (NULL),
                      "compression", "zstd");
  if (config == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  if (encrypt) {
    CLEANUP_FREE unsigned char *secret = NULL;
    size_t len;

    if ((r = read_key_file (key_file, &secret, &len)) < 0) {
      json_decref (config);
      return r;
    }
    if (gnutls_rnd (GNUTLS_RND_KEY, salt, sizeof salt) < 0) {
      json_decref (config);
      return snapfg_set_error (EIO, "no random salt");
    }
    r = repo_keys_derive (secret, len, salt, sizeof salt, KDF_ITERATIONS, &k);
    gnutls_memset (secret, 0, len);
    if (r < 0) {
      json_decref (config);
      return r;
    }
    repo_hex (salt, sizeof salt, hex);
    json_object_set_new (config, "encryption",
                         json_pack ("{s:s, s:s, s:i, s:s}",
                                    "cipher", "aes-256-gcm",
                                    "kdf", "pbkdf2-hmac-sha256",
                                    "iterations", KDF_ITERATIONS,
                                    "salt", hex));
    repo_hex (k.check, sizeof k.check, hex);
    json_object_set_new (json_object_get (config, "encryption"),
                         "key_check", json_string (hex));
  }
  config_seal (config, &k);
  gnutls_memset (&k, 0, sizeof k);

  if ((r = repo_store_open (location, s3, true, &s)) < 0) {
    json_decref (config);
    return r;
  }
  /* A directory that holds anything but a repository's config is
   * someone else's: nothing is written into it.
   */
  {
    struct repo_object_info info;
    if ((r = s->ops->head (s, REPO_CONFIG_KEY, &info)) == 0) {
      s->ops->close (s);
      json_decref (config);
      return snapfg_set_error (EEXIST, "%s: already a repository (it has a "
                               "config)", location);
    }
  }
  text = json_dumps (config, JSON_INDENT (2) | JSON_SORT_KEYS);
  if (text == NULL) {
    s->ops->close (s);
    json_decref (config);
    return snapfg_set_error (ENOMEM, "out of memory");
  }
  r = s->ops->put (s, REPO_CONFIG_KEY, text, strlen (text), true);
  free (text);
  s->ops->close (s);
  if (r == -EEXIST)
    r = snapfg_set_error (EEXIST, "%s: already a repository (it has a "
                          "config)", location);
  if (r < 0) {
    json_decref (config);
    return r;
  }
  *configp = config;
  return 0;
}

int
repo_exists (const char *location, const struct repo_s3_options *s3)
{
  struct repo_store *s;
  struct repo_object_info info;
  struct stat st;
  int r;

  if (!repo_location_is_s3 (location) &&
      (stat (location, &st) == -1 || !S_ISDIR (st.st_mode)))
    return 0;
  if ((r = repo_store_open (location, s3, false, &s)) < 0)
    return r;
  r = s->ops->head (s, REPO_CONFIG_KEY, &info);
  if (r == 0) {
    /* A file named config is not enough: it must say it is one. */
    void *buf;
    size_t len;
    json_t *c = NULL;
    if (info.size < 65536 && s->ops->get (s, REPO_CONFIG_KEY, &buf, &len) == 0) {
      c = json_loadb (buf, len, 0, NULL);
      free (buf);
    }
    /* A config that does not parse is still a repository's (damaged):
     * repo_open says what is wrong with it.
     */
    if (c && (json_string_value (json_object_get (c, "format")) == NULL ||
              strcmp (json_string_value (json_object_get (c, "format")),
                      CONFIG_FORMAT) != 0))
      r = -ENOENT;
    else if (c == NULL && info.size >= 65536)
      r = -ENOENT;
    json_decref (c);
  }
  s->ops->close (s);
  return r == 0 ? 1 : r == -ENOENT ? 0 : r;
}

/* Check the config read from the store: the format, the checksum. */
static int
config_check (struct repo *r, json_t *config)
{
  CLEANUP_FREE char *text = config_canonical (config);
  unsigned char d[REPO_DIGEST_LEN], want[REPO_DIGEST_LEN];
  const char *fmt = json_string_value (json_object_get (config, "format"));
  json_int_t cs = json_integer_value (json_object_get (config, "chunk_size"));

  if (!json_is_object (config) || fmt == NULL ||
      strcmp (fmt, CONFIG_FORMAT) != 0)
    return snapfg_set_error (EINVAL, "%s/config: not a snapfg repository's "
                             "config", r->location);
  if (json_integer_value (json_object_get (config, "version")) != 1)
    return snapfg_set_error (ENOTSUP, "%s/config: version %lld: this "
                             "snapfg-backup reads version 1", r->location,
                             json_integer_value (json_object_get (config,
                                                                  "version")));
  if (text == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  repo_sha256 (text, strlen (text), d);
  if (repo_unhex (json_string_value (json_object_get (config, "checksum")),
                  want, sizeof want) == -1 ||
      memcmp (d, want, sizeof d) != 0)
    return snapfg_set_error (EINVAL, "%s/config: its checksum does not "
                             "match: the config was changed or damaged; "
                             "the repository is not used", r->location);
  if (cs < 65536 || cs > (64 << 20) || (cs & (cs - 1)) != 0)
    return snapfg_set_error (EINVAL, "%s/config: chunk_size %lld is not a "
                             "power of two from 64K to 64M", r->location,
                             (long long) cs);
  r->chunk_size = cs;
  snprintf (r->id, sizeof r->id, "%s",
            json_string_value (json_object_get (config, "id")) ?: "");
  if (strlen (r->id) < 8)
    return snapfg_set_error (EINVAL, "%s/config: no id", r->location);
  return 0;
}

/* Derive the keys from key_file and check them against the config. */
static int
config_key (struct repo *r, json_t *config, const char *key_file)
{
  json_t *e = json_object_get (config, "encryption");
  const char *cipher = json_string_value (json_object_get (e, "cipher"));
  const char *kdf = json_string_value (json_object_get (e, "kdf"));
  json_int_t iter = json_integer_value (json_object_get (e, "iterations"));
  unsigned char salt[32], check[REPO_DIGEST_LEN], d[REPO_DIGEST_LEN];
  CLEANUP_FREE unsigned char *secret = NULL;
  CLEANUP_FREE char *text = NULL;
  size_t len;
  int ret;

  if (cipher == NULL || strcmp (cipher, "aes-256-gcm") != 0 ||
      kdf == NULL || strcmp (kdf, "pbkdf2-hmac-sha256") != 0 ||
      iter < 1000 || iter > 100000000 ||
      repo_unhex (json_string_value (json_object_get (e, "salt")), salt,
                  sizeof salt) == -1 ||
      repo_unhex (json_string_value (json_object_get (e, "key_check")),
                  check, sizeof check) == -1)
    return snapfg_set_error (EINVAL, "%s/config: its encryption is not one "
                             "this snapfg-backup knows (aes-256-gcm, "
                             "pbkdf2-hmac-sha256)", r->location);
  if ((ret = read_key_file (key_file, &secret, &len)) < 0)
    return ret;
  ret = repo_keys_derive (secret, len, salt, sizeof salt, iter, &r->keys);
  gnutls_memset (secret, 0, len);
  if (ret < 0)
    return ret;
  if (gnutls_memcmp (r->keys.check, check, sizeof check) != 0) {
    gnutls_memset (&r->keys, 0, sizeof r->keys);
    return snapfg_set_error (EACCES, "--key-file %s: the wrong key for the "
                             "repository %s", key_file, r->location);
  }
  text = config_canonical (config);
  if (text == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  repo_hmac (r->keys.mac, text, strlen (text), d);
  if (repo_unhex (json_string_value (json_object_get (config, "mac")),
                  check, sizeof check) == -1 ||
      gnutls_memcmp (d, check, sizeof d) != 0)
    return snapfg_set_error (EINVAL, "%s/config: its MAC does not match "
                             "the key: the config was tampered with; the "
                             "repository is not used", r->location);
  return 0;
}

int
repo_open (const char *location, const struct repo_s3_options *s3,
           const char *key_file, struct repo **rp)
{
  struct repo *r;
  void *buf = NULL;
  size_t len;
  json_error_t jerr;
  json_t *config = NULL;
  int ret;

  *rp = NULL;
  r = calloc (1, sizeof *r);
  if (r == NULL || (r->location = strdup (location)) == NULL) {
    free (r);
    return snapfg_set_error (ENOMEM, "out of memory");
  }
  pthread_mutex_init (&r->scratch_lock, NULL);
  if ((ret = repo_store_open (location, s3, false, &r->store)) < 0)
    goto fail;
  ret = r->store->ops->get (r->store, REPO_CONFIG_KEY, &buf, &len);
  if (ret == -ENOENT) {
    ret = snapfg_set_error (ENOENT, "%s: not a repository (no config; make "
                            "one with snapfg-backup init)", location);
    goto fail;
  }
  if (ret < 0)
    goto fail;
  config = json_loadb (buf, len, 0, &jerr);
  free (buf);
  if (config == NULL) {
    ret = snapfg_set_error (EINVAL, "%s/config: not JSON (%s, line %d): "
                            "damaged", location, jerr.text, jerr.line);
    goto fail;
  }
  if ((ret = config_check (r, config)) < 0)
    goto fail;
  r->encrypted = json_object_get (config, "encryption") != NULL;
  if (r->encrypted && key_file) {
    if ((ret = config_key (r, config, key_file)) < 0)
      goto fail;
  }
  else if (!r->encrypted && key_file) {
    ret = snapfg_set_error (EINVAL, "--key-file %s: the repository %s is not "
                            "encrypted", key_file, location);
    goto fail;
  }
  if (json_object_get (config, "mac") && !r->encrypted) {
    ret = snapfg_set_error (EINVAL, "%s/config: has a MAC but no encryption: "
                            "tampered with; the repository is not used",
                            location);
    goto fail;
  }
  r->config = config;
  *rp = r;
  return 0;

 fail:
  json_decref (config);
  repo_close (r);
  return ret;
}

void
repo_close (struct repo *r)
{
  if (r == NULL)
    return;
  if (r->store)
    r->store->ops->close (r->store);
  while (r->scratch) {
    struct repo_scratch *sc = r->scratch;
    r->scratch = sc->next;
    big_free (sc->obj, sc->cap);
    ZSTD_freeCCtx (sc->cctx);
    ZSTD_freeDCtx (sc->dctx);
    free (sc);
  }
  pthread_mutex_destroy (&r->scratch_lock);
  json_decref (r->config);
  gnutls_memset (&r->keys, 0, sizeof r->keys);
  free (r->location);
  free (r);
}

struct repo_store *repo_get_store (struct repo *r) { return r->store; }
const struct repo_keys *repo_get_keys (struct repo *r) { return &r->keys; }
bool repo_is_encrypted (struct repo *r) { return r->encrypted; }
bool repo_has_key (struct repo *r) { return !r->encrypted || r->keys.encrypted; }
const char *repo_get_id (struct repo *r) { return r->id; }
uint32_t repo_get_chunk_size (struct repo *r) { return r->chunk_size; }
const char *repo_get_location (struct repo *r) { return r->location; }

void
repo_chunk_key (const unsigned char id[REPO_DIGEST_LEN],
                char key[REPO_CHUNK_KEY_LEN])
{
  char hex[2 * REPO_DIGEST_LEN + 1];

  repo_hex (id, REPO_DIGEST_LEN, hex);
  snprintf (key, REPO_CHUNK_KEY_LEN, "chunks/%.2s/%s", hex, hex);
}

void
repo_damaged_key (const unsigned char id[REPO_DIGEST_LEN],
                  char key[REPO_CHUNK_KEY_LEN])
{
  char hex[2 * REPO_DIGEST_LEN + 1];

  repo_hex (id, REPO_DIGEST_LEN, hex);
  snprintf (key, REPO_CHUNK_KEY_LEN, "damaged/%s", hex);
}

static int
need_key (struct repo *r)
{
  return snapfg_set_error (EACCES, "%s: the repository is encrypted: give "
                           "its key with --key-file FILE", r->location);
}

/* A scratch of the repository's free list, or a new one (its buffer
 * made when first needed); NULL when out of memory.
 */
static struct repo_scratch *
scratch_get (struct repo *r)
{
  struct repo_scratch *sc;

  pthread_mutex_lock (&r->scratch_lock);
  sc = r->scratch;
  if (sc)
    r->scratch = sc->next;
  pthread_mutex_unlock (&r->scratch_lock);
  return sc ? sc : calloc (1, sizeof *sc);
}

static void
scratch_put (struct repo *r, struct repo_scratch *sc)
{
  pthread_mutex_lock (&r->scratch_lock);
  sc->next = r->scratch;
  r->scratch = sc;
  pthread_mutex_unlock (&r->scratch_lock);
}

/* Its object buffer, room for any chunk of the repository (compressed
 * or not, encrypted or not).
 */
static int
scratch_obj (struct repo *r, struct repo_scratch *sc)
{
  if (sc->obj == NULL) {
    sc->cap = repo_chunk_object_bound (r->chunk_size, 1);
    if ((sc->obj = big_alloc (sc->cap)) == NULL)
      return snapfg_set_error (ENOMEM, "out of memory for a chunk");
  }
  return 0;
}

_Static_assert (REPO_PUT_HEADROOM == REPO_CHUNK_HEADER_LEN,
                "the headroom a caller leaves is a chunk header");

/* The object of chunk id, encoded (iov: header, payload), then put in
 * the store's batch, or stored at once.
 */
static int
encode_and_put (struct repo *r, struct repo_scratch *sc,
                const unsigned char id[REPO_DIGEST_LEN], const char *key,
                const void *plain, size_t headroom, size_t len,
                int zstd_level, bool replace, size_t *obj_len)
{
  struct repo_store *s = r->store;
  bool batch = !replace && s->ops->put_unsynced && s->ops->sync;
  bool as_is = batch && zstd_level == 0 && !r->keys.encrypted;
  unsigned char head[REPO_CHUNK_HEADER_LEN], *obj = head;
  size_t cap = sizeof head;
  struct iovec iov[2];
  int ret;

  /* Stored as it is into the batch, the data goes from the caller's
   * buffer to the file: no object is built.  The header goes in front
   * of the data when the caller left room for it (the copy engine's
   * headroom), so that the object is one buffer.
   */
  if (!as_is) {
    if ((ret = scratch_obj (r, sc)) < 0)
      return ret;
    if (zstd_level > 0 && sc->cctx == NULL &&
        (sc->cctx = ZSTD_createCCtx ()) == NULL)
      return snapfg_set_error (ENOMEM, "out of memory for zstd");
    obj = sc->obj;
    cap = sc->cap;
  }
  else if (headroom >= REPO_CHUNK_HEADER_LEN)
    obj = (unsigned char *) plain - REPO_CHUNK_HEADER_LEN;
  ret = repo_chunk_encode_iov (&r->keys, id, plain, len, zstd_level,
                               sc->cctx, obj, cap, iov);
  if (ret < 0)
    return ret;
  *obj_len = iov[0].iov_len + iov[1].iov_len;
  if (batch)
    return s->ops->put_unsynced (s, key, iov, 2);
  /* One buffer for put: the payload after the header, if not there. */
  if (iov[1].iov_base != sc->obj + iov[0].iov_len)
    memcpy (sc->obj + iov[0].iov_len, iov[1].iov_base, iov[1].iov_len);
  return s->ops->put (s, key, sc->obj, *obj_len, !replace);
}

int
repo_put_chunk (struct repo *r, const unsigned char id[REPO_DIGEST_LEN],
                const void *plain, size_t headroom, size_t len,
                int zstd_level, bool replace, uint64_t *stored)
{
  struct repo_store *s = r->store;
  struct repo_scratch *sc;
  char key[REPO_CHUNK_KEY_LEN];
  size_t obj_len = 0;
  int ret;

  *stored = 0;
  if (!repo_has_key (r))
    return need_key (r);
  if (len > r->chunk_size)
    return snapfg_set_error (EINVAL, "internal error: a chunk of %zu bytes "
                             "in a repository of %u-byte chunks", len,
                             r->chunk_size);
  repo_chunk_key (id, key);
  if (!replace) {
    /* There already (another run, another disk): touched, so that a gc
     * running now keeps it; not compressed, encrypted or sent again.
     */
    ret = s->ops->touch (s, key);
    if (ret == 0)
      return 1;
    if (ret != -ENOENT)
      return ret;
  }
  /* A new chunk goes into the store's batch when it has one: durable and
   * named at repo_sync, before the index that references it.
   */
  if ((sc = scratch_get (r)) == NULL)
    return snapfg_set_error (ENOMEM, "out of memory for a chunk");
  ret = encode_and_put (r, sc, id, key, plain, headroom, len, zstd_level,
                        replace, &obj_len);
  scratch_put (r, sc);
  if (ret == -EEXIST) {
    /* Another writer stored it meanwhile, or another thread of this run
     * has it in the batch (not named yet: nothing to touch).
     */
    ret = s->ops->touch (s, key);
    return ret < 0 && ret != -ENOENT ? ret : 1;
  }
  if (ret < 0)
    return ret;
  *stored = obj_len;
  return 0;
}

int
repo_sync (struct repo *r)
{
  struct repo_store *s = r->store;

  return s->ops->sync ? s->ops->sync (s) : 0;
}

/* Read chunk key of an unencrypted repository with the store's get_iov:
 * the header apart and the payload straight into buf, so that a chunk
 * stored as it is (no zstd) is checked where it lies, not copied.  Any
 * other object is put together in the scratch buffer and decoded.
 */
static int
read_split (struct repo *r, struct repo_scratch *sc,
            const unsigned char id[REPO_DIGEST_LEN], const char *key,
            void *buf, const char *what)
{
  struct repo_store *s = r->store;
  unsigned char head[REPO_CHUNK_HEADER_LEN];
  size_t cs = r->chunk_size, len, plain_len, in_buf, rest;
  struct iovec iov[3] = {
    { .iov_base = head, .iov_len = sizeof head },
    { .iov_base = buf, .iov_len = cs },
    { .iov_base = sc->obj, .iov_len = sc->cap - sizeof head - cs },
  };
  int ret = s->ops->get_iov (s, key, iov, 3, &len);

  if (ret < 0)
    return ret;
  if (len >= sizeof head && repo_chunk_stored_as_is (head))
    return repo_chunk_check_stored (&r->keys, id, head, len, buf, cs,
                                    &plain_len, what);
  /* Header, buf's part, the rest (only when buf's part is all of buf):
   * one object in sc->obj.
   */
  in_buf = len > sizeof head ? len - sizeof head : 0;
  if (in_buf > cs)
    in_buf = cs;
  rest = len - (len < sizeof head ? len : sizeof head) - in_buf;
  memmove (sc->obj + sizeof head + cs, sc->obj, rest);
  memcpy (sc->obj, head, len < sizeof head ? len : sizeof head);
  memcpy (sc->obj + sizeof head, buf, in_buf);
  return repo_chunk_decode_inplace (&r->keys, id, sc->obj, len, buf, cs,
                                    sc->dctx, &plain_len, what);
}

/* Read chunk key whole into the scratch buffer, then decode it. */
static int
read_whole (struct repo *r, struct repo_scratch *sc,
            const unsigned char id[REPO_DIGEST_LEN], const char *key,
            void *buf, const char *what)
{
  struct repo_store *s = r->store;
  size_t len, plain_len;
  int ret = s->ops->get_iov (s, key,
                             &(struct iovec) { .iov_base = sc->obj,
                                               .iov_len = sc->cap },
                             1, &len);

  if (ret < 0)
    return ret;
  return repo_chunk_decode_inplace (&r->keys, id, sc->obj, len, buf,
                                    r->chunk_size, sc->dctx, &plain_len,
                                    what);
}

/* Read chunk key with the store's get (a buffer of its own). */
static int
read_get (struct repo *r, struct repo_scratch *sc,
          const unsigned char id[REPO_DIGEST_LEN], const char *key,
          void *buf, const char *what)
{
  struct repo_store *s = r->store;
  size_t len, plain_len;
  void *obj;
  int ret = s->ops->get (s, key, &obj, &len);

  if (ret < 0)
    return ret;
  ret = repo_chunk_decode_inplace (&r->keys, id, obj, len, buf,
                                   r->chunk_size, sc->dctx, &plain_len,
                                   what);
  free (obj);
  return ret;
}

int
repo_read_chunk_id (struct repo *r, const unsigned char id[REPO_DIGEST_LEN],
                    void *buf)
{
  char key[REPO_CHUNK_KEY_LEN], what[REPO_CHUNK_KEY_LEN + PATH_MAX];
  struct repo_scratch *sc;
  int ret;

  if (!repo_has_key (r))
    return need_key (r);
  repo_chunk_key (id, key);
  snprintf (what, sizeof what, "%s/%s", r->location, key);
  if ((sc = scratch_get (r)) == NULL)
    return snapfg_set_error (ENOMEM, "%s: out of memory", what);
  if (sc->dctx == NULL && (sc->dctx = ZSTD_createDCtx ()) == NULL)
    ret = snapfg_set_error (ENOMEM, "%s: out of memory for zstd", what);
  else if (r->store->ops->get_iov == NULL)
    ret = read_get (r, sc, id, key, buf, what);
  else if ((ret = scratch_obj (r, sc)) < 0)
    ;
  else if (!r->encrypted)
    ret = read_split (r, sc, id, key, buf, what);
  else
    ret = read_whole (r, sc, id, key, buf, what);
  scratch_put (r, sc);
  if (ret == -ENOENT)
    return snapfg_set_error (EIO, "%s: missing (removed or never stored)",
                             what);
  return ret;
}

/* --- writers --- */

struct repo_writer {
  struct repo *r;
  char id[RANDOM_UUID_LEN + 1];
  char key[64];
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool stop, started;
};

int64_t
repo_writer_stale_seconds (void)
{
  const char *t = getenv ("SNAPFG_REPO_TEST_WRITER_STALE");

  return t && *t ? strtoll (t, NULL, 10) : 600;
}

/* Refresh the registration a few times per stale period. */
static void *
heartbeat (void *arg)
{
  struct repo_writer *w = arg;
  int64_t period = repo_writer_stale_seconds () / 4;

  if (period < 1)
    period = 1;
  pthread_mutex_lock (&w->lock);
  while (!w->stop) {
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    ts.tv_sec += period;
    pthread_cond_timedwait (&w->cond, &w->lock, &ts);
    if (!w->stop) {
      pthread_mutex_unlock (&w->lock);
      w->r->store->ops->touch (w->r->store, w->key);
      pthread_mutex_lock (&w->lock);
    }
  }
  pthread_mutex_unlock (&w->lock);
  return NULL;
}

int
repo_writer_start (struct repo *r, const char *disk, struct repo_writer **wp)
{
  struct repo_writer *w = calloc (1, sizeof *w);
  char host[256] = "";
  char *text;
  json_t *reg;
  int ret;

  *wp = NULL;
  if (w == NULL)
    return snapfg_set_error (ENOMEM, "out of memory");
  w->r = r;
  random_uuid (w->id);
  snprintf (w->key, sizeof w->key, "writers/%s", w->id);
  gethostname (host, sizeof host - 1);
  reg = json_pack ("{s:I, s:s, s:i, s:s}",
                   "start", (json_int_t) time (NULL),
                   "host", host, "pid", (int) getpid (), "disk", disk);
  text = reg ? json_dumps (reg, JSON_COMPACT) : NULL;
  json_decref (reg);
  if (text == NULL) {
    free (w);
    return snapfg_set_error (ENOMEM, "out of memory");
  }
  /* Visible to gc at once is all a registration needs: a crash that
   * could lose it ends the run too (repo-store.h, put_volatile).
   */
  ret = r->store->ops->put_volatile
    ? r->store->ops->put_volatile (r->store, w->key, text, strlen (text))
    : r->store->ops->put (r->store, w->key, text, strlen (text), true);
  free (text);
  if (ret < 0) {
    free (w);
    return ret;
  }
  pthread_mutex_init (&w->lock, NULL);
  pthread_cond_init (&w->cond, NULL);
  w->started = pthread_create (&w->thread, NULL, heartbeat, w) == 0;
  *wp = w;
  return 0;
}

void
repo_writer_end (struct repo_writer *w)
{
  if (w == NULL)
    return;
  if (w->started) {
    pthread_mutex_lock (&w->lock);
    w->stop = true;
    pthread_cond_signal (&w->cond);
    pthread_mutex_unlock (&w->lock);
    pthread_join (w->thread, NULL);
  }
  w->r->store->ops->del (w->r->store, w->key);
  pthread_mutex_destroy (&w->lock);
  pthread_cond_destroy (&w->cond);
  free (w);
}

const char *
repo_writer_id (const struct repo_writer *w)
{
  return w->id;
}

struct writers_scan {
  struct repo *r;
  char host[256];
  int64_t now, stale;
  size_t n;
  int64_t oldest;
  json_t *list;
};

static int
writer_seen (void *opaque, const struct repo_object_info *info)
{
  struct writers_scan *ws = opaque;
  struct repo_store *s = ws->r->store;
  void *buf;
  size_t len;
  json_t *j;
  int64_t start;

  if (info->mtime < ws->now - ws->stale)
    return 0;                   /* crashed long ago */
  if (s->ops->get (s, info->key, &buf, &len) < 0)
    return 0;                   /* ended meanwhile */
  j = json_loadb (buf, len, 0, NULL);
  free (buf);
  /* A writer of this host whose process is gone crashed: no need to
   * wait until its registration is stale.
   */
  {
    const char *host = json_string_value (json_object_get (j, "host"));
    json_int_t pid = json_integer_value (json_object_get (j, "pid"));
    if (host && pid > 0 && strcmp (host, ws->host) == 0 &&
        kill ((pid_t) pid, 0) == -1 && errno == ESRCH) {
      json_decref (j);
      return 0;
    }
  }
  /* A registration that cannot be read still counts, from its mtime
   * less the stale time: the safe side.
   */
  start = j ? json_integer_value (json_object_get (j, "start"))
            : info->mtime - ws->stale;
  if (start <= 0 || start > info->mtime)
    start = info->mtime - ws->stale;
  ws->n++;
  if (start < ws->oldest)
    ws->oldest = start;
  if (ws->list && j) {
    json_object_set_new (j, "id", json_string (info->key + 8));
    json_array_append (ws->list, j);
  }
  json_decref (j);
  return 0;
}

int
repo_live_writers (struct repo *r, size_t *n, int64_t *oldest, json_t **list)
{
  struct writers_scan ws = { .r = r, .now = time (NULL),
                             .stale = repo_writer_stale_seconds (),
                             .oldest = INT64_MAX,
                             .list = list ? json_array () : NULL };
  int ret;

  gethostname (ws.host, sizeof ws.host - 1);
  ret = r->store->ops->list (r->store, "writers/", writer_seen, &ws);
  if (ret < 0) {
    json_decref (ws.list);
    return ret;
  }
  *n = ws.n;
  *oldest = ws.oldest;
  if (list)
    *list = ws.list;
  return 0;
}
