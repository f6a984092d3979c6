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
#include <sys/uio.h>

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

size_t
repo_chunk_object_bound (size_t len, int zstd_level)
{
  return REPO_CHUNK_HEADER_LEN + REPO_NONCE_LEN + REPO_TAG_LEN +
    (zstd_level > 0 ? ZSTD_compressBound (len) : len);
}

/* zstd of plain into dst (cap bytes) with cctx (NULL: a context made for
 * this call): its length if smaller than the data, else 0 (the chunk
 * is kept as it is).
 */
static size_t
compress_chunk (ZSTD_CCtx *cctx, void *dst, size_t cap, const void *plain,
                size_t len, int level)
{
  size_t z = cctx ? ZSTD_compressCCtx (cctx, dst, cap, plain, len, level)
    : ZSTD_compress (dst, cap, plain, len, level);

  return !ZSTD_isError (z) && z < len ? z : 0;
}

/* AES-256-GCM of data (data_len bytes) into obj's payload, after its
 * header (written already) and a new nonce; the tag after it.  data may
 * be the payload itself (encrypted in place).
 */
static int
encrypt_chunk (const struct repo_keys *k,
               const unsigned char id[REPO_DIGEST_LEN], unsigned char *obj,
               const void *data, size_t data_len)
{
  gnutls_cipher_hd_t h;
  gnutls_datum_t key = { .data = (void *) k->enc, .size = 32 };
  unsigned char aad[REPO_CHUNK_HEADER_LEN + REPO_DIGEST_LEN];
  unsigned char *nonce = obj + REPO_CHUNK_HEADER_LEN;
  unsigned char *payload = nonce + REPO_NONCE_LEN;
  int r;

  make_aad (obj, id, aad);
  if (gnutls_rnd (GNUTLS_RND_NONCE, nonce, REPO_NONCE_LEN) < 0)
    return snapfg_set_error (EIO, "no random nonce for a chunk");
  /* The bulk (non-AEAD) API, one cipher per chunk: it takes no lock, so
   * every thread encrypts at once.
   */
  if ((r = gnutls_cipher_init (&h, GNUTLS_CIPHER_AES_256_GCM, &key,
                               &(gnutls_datum_t) { .data = nonce,
                                                   .size = REPO_NONCE_LEN }))
      < 0)
    return snapfg_set_error (EIO, "AES-256-GCM: %s", gnutls_strerror (r));
  r = gnutls_cipher_add_auth (h, aad, sizeof aad);
  if (r >= 0)
    r = data == payload ? gnutls_cipher_encrypt (h, payload, data_len)
      : gnutls_cipher_encrypt2 (h, data, data_len, payload, data_len);
  if (r >= 0)
    r = gnutls_cipher_tag (h, payload + data_len, REPO_TAG_LEN);
  gnutls_cipher_deinit (h);
  if (r < 0)
    return snapfg_set_error (EIO, "AES-256-GCM encryption failed");
  return 0;
}

int
repo_chunk_encode_iov (const struct repo_keys *k,
                       const unsigned char id[REPO_DIGEST_LEN],
                       const void *plain, size_t len, int zstd_level,
                       struct ZSTD_CCtx_s *cctx, void *objv, size_t cap,
                       struct iovec iov[2])
{
  bool enc = k && k->encrypted;
  unsigned char *obj = objv;
  size_t head = REPO_CHUNK_HEADER_LEN + (enc ? REPO_NONCE_LEN : 0);
  unsigned char *payload = obj + head;
  const void *data = plain;
  size_t data_len = len;
  unsigned flags = 0;

  if (len > UINT32_MAX / 2)
    return snapfg_set_error (EINVAL, "a chunk of %zu bytes is too big", len);
  if (cap < (enc || zstd_level > 0 ? repo_chunk_object_bound (len, zstd_level)
             : REPO_CHUNK_HEADER_LEN))
    return snapfg_set_error (EINVAL, "internal error: %zu bytes are too few "
                             "for a chunk object of %zu", cap, len);
  if (zstd_level > 0) {
    /* Straight into the payload; encrypted in place from there. */
    size_t z = compress_chunk (cctx, payload, cap - head - REPO_TAG_LEN,
                               plain, len, zstd_level);
    if (z) {
      flags |= FLAG_ZSTD;
      data = payload;
      data_len = z;
    }
  }
  iov[0] = (struct iovec) { .iov_base = obj, .iov_len = head };
  if (enc) {
    int r;

    put_header (obj, flags | FLAG_AES_GCM, len, data_len + REPO_TAG_LEN);
    if ((r = encrypt_chunk (k, id, obj, data, data_len)) < 0)
      return r;
    iov[1] = (struct iovec) { .iov_base = payload,
                              .iov_len = data_len + REPO_TAG_LEN };
  }
  else {
    put_header (obj, flags, len, data_len);
    iov[1] = (struct iovec) { .iov_base = (void *) data,
                              .iov_len = data_len };
  }
  return 0;
}

int
repo_chunk_encode (const struct repo_keys *k,
                   const unsigned char id[REPO_DIGEST_LEN],
                   const void *plain, size_t len, int zstd_level,
                   void **out, size_t *out_len)
{
  size_t cap = repo_chunk_object_bound (len, zstd_level);
  unsigned char *obj = malloc (cap);
  struct iovec iov[2];
  int r;

  *out = NULL;
  if (obj == NULL)
    return snapfg_set_error (ENOMEM, "out of memory for a chunk");
  if ((r = repo_chunk_encode_iov (k, id, plain, len, zstd_level, NULL, obj,
                                  cap, iov)) < 0) {
    free (obj);
    return r;
  }
  if (iov[1].iov_base != obj + iov[0].iov_len)
    memcpy (obj + iov[0].iov_len, iov[1].iov_base, iov[1].iov_len);
  *out = obj;
  *out_len = iov[0].iov_len + iov[1].iov_len;
  return 0;
}

/* A chunk object's header, checked against the object's length and the
 * repository's key: its flags, plain length and payload's offset.
 */
static int
parse_header (const struct repo_keys *k, const unsigned char *obj,
              size_t obj_len, size_t cap, unsigned *flags, uint32_t *plen,
              size_t *head, size_t *paylen, const char *what)
{
  uint32_t v;

  if (obj_len < REPO_CHUNK_HEADER_LEN || memcmp (obj, CHUNK_MAGIC, 4) != 0 ||
      obj[4] != CHUNK_VERSION)
    return snapfg_set_error (EIO, "%s: not a chunk object (bad header)",
                             what);
  *flags = obj[5];
  memcpy (&v, obj + 8, 4);
  *plen = le32toh (v);
  memcpy (&v, obj + 12, 4);
  *paylen = le32toh (v);
  if (*plen > cap)
    return snapfg_set_error (EIO, "%s: holds %u bytes, more than a chunk "
                             "(%zu)", what, *plen, cap);
  if ((*flags & ~(FLAG_ZSTD | FLAG_AES_GCM)) != 0)
    return snapfg_set_error (EIO, "%s: unknown flags 0x%x", what, *flags);
  if (!!(*flags & FLAG_AES_GCM) != !!(k && k->encrypted))
    return snapfg_set_error (EIO, "%s: %s, but the repository is %s", what,
                             *flags & FLAG_AES_GCM ? "encrypted"
                             : "not encrypted",
                             k && k->encrypted ? "encrypted"
                             : "not encrypted");
  *head = REPO_CHUNK_HEADER_LEN + (*flags & FLAG_AES_GCM ? REPO_NONCE_LEN : 0);
  if (*head + *paylen != obj_len)
    return snapfg_set_error (EIO, "%s: %zu bytes, its header says %zu "
                             "(truncated or extended)", what, obj_len,
                             *head + *paylen);
  return 0;
}

/* Decrypt and authenticate the payload (paylen bytes with its tag) of
 * obj in place; *data_len its plain length.
 */
static int
decrypt_chunk (const struct repo_keys *k,
               const unsigned char id[REPO_DIGEST_LEN], unsigned char *obj,
               size_t paylen, size_t *data_len, const char *what)
{
  gnutls_cipher_hd_t h;
  gnutls_datum_t key = { .data = (void *) k->enc, .size = 32 };
  unsigned char aad[REPO_CHUNK_HEADER_LEN + REPO_DIGEST_LEN];
  unsigned char tag[REPO_TAG_LEN];
  unsigned char *payload = obj + REPO_CHUNK_HEADER_LEN + REPO_NONCE_LEN;
  int r;

  if (paylen < REPO_TAG_LEN)
    return snapfg_set_error (EIO, "%s: too short for its tag", what);
  *data_len = paylen - REPO_TAG_LEN;
  make_aad (obj, id, aad);
  if (gnutls_cipher_init (&h, GNUTLS_CIPHER_AES_256_GCM, &key,
                          &(gnutls_datum_t) {
                            .data = obj + REPO_CHUNK_HEADER_LEN,
                            .size = REPO_NONCE_LEN }) < 0)
    return snapfg_set_error (EIO, "%s: AES-256-GCM init failed", what);
  r = gnutls_cipher_add_auth (h, aad, sizeof aad);
  if (r >= 0)
    r = gnutls_cipher_decrypt (h, payload, *data_len);
  if (r >= 0)
    r = gnutls_cipher_tag (h, tag, sizeof tag);
  gnutls_cipher_deinit (h);
  if (r < 0)
    return snapfg_set_error (EIO, "%s: decryption failed", what);
  if (gnutls_memcmp (tag, payload + *data_len, REPO_TAG_LEN) != 0)
    return snapfg_set_error (EIO, "%s: damaged (its authentication tag "
                             "does not match: changed, or not this "
                             "repository's key)", what);
  return 0;
}

/* The rest of buf zeroed, the plain data's id computed and compared. */
static int
check_plain (const struct repo_keys *k,
             const unsigned char id[REPO_DIGEST_LEN], void *buf, size_t cap,
             uint32_t plen, const char *what)
{
  unsigned char sha[REPO_DIGEST_LEN], got[REPO_DIGEST_LEN];

  if (plen < cap)
    memset ((char *) buf + plen, 0, cap - plen);
  if (repo_sha256 (buf, plen, sha) < 0)
    return snapfg_set_error (EIO, "%s: SHA-256 failed", what);
  repo_chunk_id (k, sha, got);
  if (memcmp (got, id, REPO_DIGEST_LEN) != 0)
    return snapfg_set_error (EIO, "%s: damaged (its data does not match "
                             "its digest)", what);
  return 0;
}

int
repo_chunk_decode_inplace (const struct repo_keys *k,
                           const unsigned char id[REPO_DIGEST_LEN],
                           void *objv, size_t obj_len, void *buf, size_t cap,
                           struct ZSTD_DCtx_s *dctx, size_t *plain_len,
                           const char *what)
{
  unsigned char *obj = objv, *payload;
  unsigned flags;
  uint32_t plen;
  size_t head, data_len;
  int r;

  if ((r = parse_header (k, obj, obj_len, cap, &flags, &plen, &head,
                         &data_len, what)) < 0)
    return r;
  payload = obj + head;
  if ((flags & FLAG_AES_GCM) &&
      (r = decrypt_chunk (k, id, obj, data_len, &data_len, what)) < 0)
    return r;
  if (flags & FLAG_ZSTD) {
    size_t z = dctx ? ZSTD_decompressDCtx (dctx, buf, cap, payload, data_len)
      : ZSTD_decompress (buf, cap, payload, data_len);
    if (ZSTD_isError (z) || z != plen)
      return snapfg_set_error (EIO, "%s: damaged (zstd: %s)", what,
                               ZSTD_isError (z) ? ZSTD_getErrorName (z)
                               : "wrong length");
  }
  else {
    if (data_len != plen)
      return snapfg_set_error (EIO, "%s: damaged (length)", what);
    if (payload != buf)
      memcpy (buf, payload, plen);
  }
  if ((r = check_plain (k, id, buf, cap, plen, what)) < 0)
    return r;
  *plain_len = plen;
  return 0;
}

int
repo_chunk_check_stored (const struct repo_keys *k,
                         const unsigned char id[REPO_DIGEST_LEN],
                         const unsigned char hdr[REPO_CHUNK_HEADER_LEN],
                         size_t obj_len, void *buf, size_t cap,
                         size_t *plain_len, const char *what)
{
  unsigned flags;
  uint32_t plen;
  size_t head, data_len;
  int r;

  if ((r = parse_header (k, hdr, obj_len, cap, &flags, &plen, &head,
                         &data_len, what)) < 0)
    return r;
  if (flags != 0)
    return snapfg_set_error (EINVAL, "internal error: %s is not stored as "
                             "it is", what);
  if (data_len != plen)
    return snapfg_set_error (EIO, "%s: damaged (length)", what);
  if ((r = check_plain (k, id, buf, cap, plen, what)) < 0)
    return r;
  *plain_len = plen;
  return 0;
}

int
repo_chunk_decode (const struct repo_keys *k,
                   const unsigned char id[REPO_DIGEST_LEN],
                   const void *objv, size_t obj_len, void *buf, size_t cap,
                   size_t *plain_len, const char *what)
{
  void *copy;
  int r;

  /* Decoding works in place: on a copy, the object being the caller's. */
  if ((copy = malloc (obj_len ? obj_len : 1)) == NULL)
    return snapfg_set_error (ENOMEM, "%s: out of memory", what);
  memcpy (copy, objv, obj_len);
  r = repo_chunk_decode_inplace (k, id, copy, obj_len, buf, cap, NULL,
                                 plain_len, what);
  free (copy);
  return r;
}

bool
repo_chunk_stored_as_is (const unsigned char hdr[REPO_CHUNK_HEADER_LEN])
{
  return memcmp (hdr, CHUNK_MAGIC, 4) == 0 && hdr[4] == CHUNK_VERSION &&
    hdr[5] == 0;
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
