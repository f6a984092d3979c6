/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: keys, digests and the chunk object format.
 *
 * GnuTLS for SHA-256, HMAC, PBKDF2 and AES-256-GCM (it is in the stack
 * already: libnbd uses it for TLS, snapfg-backup for its checksums),
 * libzstd for compression.  The format is docs/repository.md.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <stdio.h>

#include <gnutls/gnutls.h>
#include <gnutls/crypto.h>
#include <zstd.h>

#include "byte-order.h"
#include "snapfg-error.h"
#include "repo-chunk.h"

#define CHUNK_MAGIC "SFGC"
#define CHUNK_VERSION 1
#define FLAG_ZSTD 1
#define FLAG_AES_GCM 2

int
repo_sha256 (const void *buf, size_t len, unsigned char out[REPO_DIGEST_LEN])
{
  return gnutls_hash_fast (GNUTLS_DIG_SHA256, buf, len, out) == 0 ? 0 : -EIO;
}

int
repo_hmac (const unsigned char key[32], const void *buf, size_t len,
           unsigned char out[REPO_DIGEST_LEN])
{
  return gnutls_hmac_fast (GNUTLS_MAC_SHA256, key, 32, buf, len, out) == 0
    ? 0 : -EIO;
}

int
repo_keys_derive (const void *secret, size_t len, const unsigned char *salt,
                  size_t salt_len, unsigned iterations, struct repo_keys *k)
{
  gnutls_datum_t key = { .data = (void *) secret, .size = len };
  gnutls_datum_t s = { .data = (void *) salt, .size = salt_len };
  unsigned char master[32];
  int r;

  memset (k, 0, sizeof *k);
  r = gnutls_pbkdf2 (GNUTLS_MAC_SHA256, &key, &s, iterations, master,
                     sizeof master);
  if (r < 0)
    return snapfg_set_error (EIO, "deriving the repository's keys: %s",
                             gnutls_strerror (r));
  if (repo_hmac (master, "snapfg-repo chunk encryption", 28, k->enc) < 0 ||
      repo_hmac (master, "snapfg-repo chunk id", 20, k->id) < 0 ||
      repo_hmac (master, "snapfg-repo metadata mac", 24, k->mac) < 0 ||
      repo_hmac (master, "snapfg-repo key check", 21, k->check) < 0)
    return snapfg_set_error (EIO, "deriving the repository's keys: HMAC "
                             "failed");
  gnutls_memset (master, 0, sizeof master);
  k->encrypted = true;
  return 0;
}

void
repo_chunk_id (const struct repo_keys *k,
               const unsigned char sha[REPO_DIGEST_LEN],
               unsigned char id[REPO_DIGEST_LEN])
{
  if (k && k->encrypted) {
    if (repo_hmac (k->id, sha, REPO_DIGEST_LEN, id) < 0)
      abort ();                 /* HMAC-SHA256 of 32 bytes cannot fail */
  }
  else
    memcpy (id, sha, REPO_DIGEST_LEN);
}

static void
put_header (unsigned char *h, unsigned flags, uint32_t plain_len,
            uint32_t payload_len)
{
  uint32_t v;

  memcpy (h, CHUNK_MAGIC, 4);
  h[4] = CHUNK_VERSION;
  h[5] = flags;
  h[6] = h[7] = 0;
  v = htole32 (plain_len);
  memcpy (h + 8, &v, 4);
  v = htole32 (payload_len);
  memcpy (h + 12, &v, 4);
}

/* The associated data of a chunk's encryption: its header and its id,
 * so that neither can be changed, nor one chunk put in another's place.
 */
static void
make_aad (const unsigned char *h, const unsigned char id[REPO_DIGEST_LEN],
          unsigned char aad[REPO_CHUNK_HEADER_LEN + REPO_DIGEST_LEN])
{
  memcpy (aad, h, REPO_CHUNK_HEADER_LEN);
  memcpy (aad + REPO_CHUNK_HEADER_LEN, id, REPO_DIGEST_LEN);
}

int
repo_chunk_encode (const struct repo_keys *k,
                   const unsigned char id[REPO_DIGEST_LEN],
                   const void *plain, size_t len, int zstd_level,
                   void **out, size_t *out_len)
{
  bool enc = k && k->encrypted;
  size_t cap = REPO_CHUNK_HEADER_LEN + REPO_NONCE_LEN + REPO_TAG_LEN +
    (zstd_level > 0 ? ZSTD_compressBound (len) : len);
  unsigned char *obj = malloc (cap), *payload;
  const void *data = plain;
  size_t data_len = len;
  unsigned flags = 0;
  void *zbuf = NULL;

  *out = NULL;
  if (obj == NULL)
    return snapfg_set_error (ENOMEM, "out of memory for a chunk");
  if (len > UINT32_MAX / 2) {
    free (obj);
    return snapfg_set_error (EINVAL, "a chunk of %zu bytes is too big", len);
  }
  payload = obj + REPO_CHUNK_HEADER_LEN + (enc ? REPO_NONCE_LEN : 0);
  if (zstd_level > 0) {
    /* Compress straight into place when there is no encryption. */
    void *dst = enc ? (zbuf = malloc (ZSTD_compressBound (len))) : payload;
    size_t z;

    if (dst == NULL) {
      free (obj);
      return snapfg_set_error (ENOMEM, "out of memory for a chunk");
    }
    z = ZSTD_compress (dst, ZSTD_compressBound (len), plain, len, zstd_level);
    if (!ZSTD_isError (z) && z < len) {
      flags |= FLAG_ZSTD;
      data = dst;
      data_len = z;
    }
  }
  if (enc) {
    gnutls_cipher_hd_t h;
    gnutls_datum_t key = { .data = (void *) k->enc, .size = 32 };
    unsigned char aad[REPO_CHUNK_HEADER_LEN + REPO_DIGEST_LEN];
    unsigned char *nonce = obj + REPO_CHUNK_HEADER_LEN;
    int r;

    flags |= FLAG_AES_GCM;
    put_header (obj, flags, len, data_len + REPO_TAG_LEN);
    make_aad (obj, id, aad);
    if (gnutls_rnd (GNUTLS_RND_NONCE, nonce, REPO_NONCE_LEN) < 0) {
      free (zbuf);
      free (obj);
      return snapfg_set_error (EIO, "no random nonce for a chunk");
    }
    /* The bulk (non-AEAD) API in place, one cipher per chunk: it takes
     * no lock, so every thread encrypts at once.
     */
    if ((r = gnutls_cipher_init (&h, GNUTLS_CIPHER_AES_256_GCM, &key,
                                 &(gnutls_datum_t) { .data = nonce,
                                                     .size = REPO_NONCE_LEN }))
        < 0) {
      free (zbuf);
      free (obj);
      return snapfg_set_error (EIO, "AES-256-GCM: %s", gnutls_strerror (r));
    }
    if (data != payload)
      memcpy (payload, data, data_len);
    if (gnutls_cipher_add_auth (h, aad, sizeof aad) < 0 ||
        gnutls_cipher_encrypt (h, payload, data_len) < 0 ||
        gnutls_cipher_tag (h, payload + data_len, REPO_TAG_LEN) < 0) {
      gnutls_cipher_deinit (h);
      free (zbuf);
      free (obj);
      return snapfg_set_error (EIO, "AES-256-GCM encryption failed");
    }
    gnutls_cipher_deinit (h);
    *out_len = REPO_CHUNK_HEADER_LEN + REPO_NONCE_LEN + data_len +
      REPO_TAG_LEN;
  }
  else {
    put_header (obj, flags, len, data_len);
    if (data != payload)
      memcpy (payload, data, data_len);
    *out_len = REPO_CHUNK_HEADER_LEN + data_len;
  }
  free (zbuf);
  *out = obj;
  return 0;
}

int
repo_chunk_decode (const struct repo_keys *k,
                   const unsigned char id[REPO_DIGEST_LEN],
                   const void *objv, size_t obj_len, void *buf, size_t cap,
                   size_t *plain_len, const char *what)
{
  const unsigned char *obj = objv;
  unsigned char sha[REPO_DIGEST_LEN], got[REPO_DIGEST_LEN];
  uint32_t plen, paylen;
  unsigned flags;
  const unsigned char *payload;
  unsigned char *tmp = NULL;
  size_t data_len;

  if (obj_len < REPO_CHUNK_HEADER_LEN || memcmp (obj, CHUNK_MAGIC, 4) != 0 ||
      obj[4] != CHUNK_VERSION)
    return snapfg_set_error (EIO, "%s: not a chunk object (bad header)",
                             what);
  flags = obj[5];
  memcpy (&plen, obj + 8, 4);
  memcpy (&paylen, obj + 12, 4);
  plen = le32toh (plen);
  paylen = le32toh (paylen);
  if (plen > cap)
    return snapfg_set_error (EIO, "%s: holds %u bytes, more than a chunk "
                             "(%zu)", what, plen, cap);
  if ((flags & ~(FLAG_ZSTD | FLAG_AES_GCM)) != 0)
    return snapfg_set_error (EIO, "%s: unknown flags 0x%x", what, flags);
  if (!!(flags & FLAG_AES_GCM) != !!(k && k->encrypted))
    return snapfg_set_error (EIO, "%s: %s, but the repository is %s", what,
                             flags & FLAG_AES_GCM ? "encrypted"
                             : "not encrypted",
                             k && k->encrypted ? "encrypted"
                             : "not encrypted");
  payload = obj + REPO_CHUNK_HEADER_LEN +
    (flags & FLAG_AES_GCM ? REPO_NONCE_LEN : 0);
  if ((size_t) (payload - obj) + paylen != obj_len)
    return snapfg_set_error (EIO, "%s: %zu bytes, its header says %zu "
                             "(truncated or extended)", what, obj_len,
                             (size_t) (payload - obj) + paylen);
  data_len = paylen;
  if (flags & FLAG_AES_GCM) {
    gnutls_cipher_hd_t h;
    gnutls_datum_t key = { .data = (void *) k->enc, .size = 32 };
    unsigned char aad[REPO_CHUNK_HEADER_LEN + REPO_DIGEST_LEN];
    unsigned char tag[REPO_TAG_LEN];

    if (paylen < REPO_TAG_LEN)
      return snapfg_set_error (EIO, "%s: too short for its tag", what);
    data_len = paylen - REPO_TAG_LEN;
    /* Decrypt into buf when it is the plain data, else into tmp. */
    if (!(flags & FLAG_ZSTD) && data_len <= cap)
      tmp = NULL;
    else if ((tmp = malloc (data_len ? data_len : 1)) == NULL)
      return snapfg_set_error (ENOMEM, "%s: out of memory", what);
    make_aad (obj, id, aad);
    if (gnutls_cipher_init (&h, GNUTLS_CIPHER_AES_256_GCM, &key,
                            &(gnutls_datum_t) {
                              .data = (void *) (obj + REPO_CHUNK_HEADER_LEN),
                              .size = REPO_NONCE_LEN }) < 0) {
      free (tmp);
      return snapfg_set_error (EIO, "%s: AES-256-GCM init failed", what);
    }
    if (gnutls_cipher_add_auth (h, aad, sizeof aad) < 0 ||
        gnutls_cipher_decrypt2 (h, payload, data_len, tmp ? tmp : buf,
                                data_len) < 0 ||
        gnutls_cipher_tag (h, tag, sizeof tag) < 0) {
      gnutls_cipher_deinit (h);
      free (tmp);
      return snapfg_set_error (EIO, "%s: decryption failed", what);
    }
    gnutls_cipher_deinit (h);
    if (gnutls_memcmp (tag, payload + data_len, REPO_TAG_LEN) != 0) {
      free (tmp);
      return snapfg_set_error (EIO, "%s: damaged (its authentication tag "
                               "does not match: changed, or not this "
                               "repository's key)", what);
    }
    payload = tmp ? tmp : buf;
  }
  if (flags & FLAG_ZSTD) {
    size_t z = ZSTD_decompress (buf, cap, payload, data_len);
    free (tmp);
    if (ZSTD_isError (z) || z != plen)
      return snapfg_set_error (EIO, "%s: damaged (zstd: %s)", what,
                               ZSTD_isError (z) ? ZSTD_getErrorName (z)
                               : "wrong length");
  }
  else {
    if (data_len != plen) {
      free (tmp);
      return snapfg_set_error (EIO, "%s: damaged (length)", what);
    }
    if (payload != buf)
      memcpy (buf, payload, plen);
    free (tmp);
  }
  if (plen < cap)
    memset ((char *) buf + plen, 0, cap - plen);
  if (repo_sha256 (buf, plen, sha) < 0)
    return snapfg_set_error (EIO, "%s: SHA-256 failed", what);
  repo_chunk_id (k, sha, got);
  if (memcmp (got, id, REPO_DIGEST_LEN) != 0)
    return snapfg_set_error (EIO, "%s: damaged (its data does not match "
                             "its digest)", what);
  *plain_len = plen;
  return 0;
}

void
repo_hex (const unsigned char *d, size_t len, char *out)
{
  static const char x[] = "0123456789abcdef";

  for (size_t i = 0; i < len; ++i) {
    out[2 * i] = x[d[i] >> 4];
    out[2 * i + 1] = x[d[i] & 15];
  }
  out[2 * len] = '\0';
}

static int
nibble (char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

int
repo_unhex (const char *hex, unsigned char *out, size_t len)
{
  if (hex == NULL || strlen (hex) != 2 * len)
    return -1;
  for (size_t i = 0; i < len; ++i) {
    int a = nibble (hex[2 * i]), b = nibble (hex[2 * i + 1]);
    if (a < 0 || b < 0)
      return -1;
    out[i] = a << 4 | b;
  }
  return 0;
}

bool
repo_digest_is_zero (const unsigned char d[REPO_DIGEST_LEN])
{
  for (int i = 0; i < REPO_DIGEST_LEN; ++i)
    if (d[i])
      return false;
  return true;
}
