/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: keys, digests and the chunk object format
 * (docs/repository.md, "Chunks" and "Keys").
 */
#ifndef SNAPFG_REPO_CHUNK_H
#define SNAPFG_REPO_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REPO_DIGEST_LEN 32
#define REPO_CHUNK_HEADER_LEN 16
#define REPO_NONCE_LEN 12
#define REPO_TAG_LEN 16

/* The keys of an encrypted repository, all derived from the key file. */
struct repo_keys {
  bool encrypted;
  unsigned char enc[32];        /* AES-256-GCM key of the chunks */
  unsigned char id[32];         /* HMAC key of the chunk ids */
  unsigned char mac[32];        /* HMAC key of the config and indexes */
  unsigned char check[32];      /* stored in the config: a wrong key is
                                 * refused before anything is read */
};

/* PBKDF2-HMAC-SHA256 of the key file's bytes, then one HMAC-SHA256 per
 * purpose.  0, or a negative errno with the error recorded.
 */
extern int repo_keys_derive (const void *secret, size_t len,
                             const unsigned char *salt, size_t salt_len,
                             unsigned iterations, struct repo_keys *k);

/* SHA-256 and HMAC-SHA256 (0 or -EIO). */
extern int repo_sha256 (const void *buf, size_t len,
                        unsigned char out[REPO_DIGEST_LEN]);
extern int repo_hmac (const unsigned char key[32], const void *buf,
                      size_t len, unsigned char out[REPO_DIGEST_LEN]);

/* A chunk's id from the SHA-256 of its plain data: that digest, or in
 * an encrypted repository HMAC-SHA256(id key, digest), so that equal
 * data under different keys has different ids and an id says nothing
 * about the data to one without the key.
 */
extern void repo_chunk_id (const struct repo_keys *k,
                           const unsigned char sha[REPO_DIGEST_LEN],
                           unsigned char id[REPO_DIGEST_LEN]);

/* The chunk object for plain[0..len): header, zstd (level > 0, kept only
 * when it is smaller), AES-256-GCM with the header and id as associated
 * data.  *out is malloc'd.  0 or a negative errno.
 */
extern int repo_chunk_encode (const struct repo_keys *k,
                              const unsigned char id[REPO_DIGEST_LEN],
                              const void *plain, size_t len, int zstd_level,
                              void **out, size_t *out_len);

/* The most bytes a chunk object of len plain bytes can take. */
extern size_t repo_chunk_object_bound (size_t len, int zstd_level);

/* struct iovec (<sys/uio.h>) and zstd's contexts, by name only. */
struct iovec;
struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

/* As repo_chunk_encode, without a copy or an allocation: the object is
 * iov[0] (its header, in obj) then iov[1] (its payload: in obj, or plain
 * itself when it is stored as it is).  obj holds cap bytes: at least
 * repo_chunk_object_bound, or with neither zstd nor encryption only
 * REPO_CHUNK_HEADER_LEN.  cctx, if not NULL, is the calling thread's
 * (ZSTD_compress makes and frees a context each call).
 */
extern int repo_chunk_encode_iov (const struct repo_keys *k,
                                  const unsigned char id[REPO_DIGEST_LEN],
                                  const void *plain, size_t len,
                                  int zstd_level, struct ZSTD_CCtx_s *cctx,
                                  void *obj, size_t cap,
                                  struct iovec iov[2]);

/* Is the object whose header this is stored as it is (the payload is
 * the plain data)?  A header that is not a chunk's says false.
 */
extern bool repo_chunk_stored_as_is
  (const unsigned char hdr[REPO_CHUNK_HEADER_LEN]);

/* Check a chunk stored as it is whose payload was read straight into
 * buf (obj_len the whole object's length, hdr its header): as
 * repo_chunk_decode, without a copy.
 */
extern int repo_chunk_check_stored (const struct repo_keys *k,
                                    const unsigned char id[REPO_DIGEST_LEN],
                                    const unsigned char
                                    hdr[REPO_CHUNK_HEADER_LEN],
                                    size_t obj_len, void *buf, size_t cap,
                                    size_t *plain_len, const char *what);

/* As repo_chunk_decode, decrypting in place in obj (which it changes)
 * and with the calling thread's dctx if not NULL.
 */
extern int repo_chunk_decode_inplace (const struct repo_keys *k,
                                      const unsigned char
                                      id[REPO_DIGEST_LEN],
                                      void *obj, size_t obj_len,
                                      void *buf, size_t cap,
                                      struct ZSTD_DCtx_s *dctx,
                                      size_t *plain_len, const char *what);

/* The plain data of a chunk object into buf (of cap bytes; the rest of
 * buf is zeroed), checked: decrypted and authenticated, decompressed,
 * its id computed again and compared.  -EIO with the error recorded
 * (naming what) when anything is wrong.
 */
extern int repo_chunk_decode (const struct repo_keys *k,
                              const unsigned char id[REPO_DIGEST_LEN],
                              const void *obj, size_t obj_len,
                              void *buf, size_t cap, size_t *plain_len,
                              const char *what);

/* Hex of a digest (65 bytes with the NUL) and back (-1: not hex). */
extern void repo_hex (const unsigned char *d, size_t len, char *out);
extern int repo_unhex (const char *hex, unsigned char *out, size_t len);

/* Is every byte of d zero? (a zero chunk in an index) */
extern bool repo_digest_is_zero (const unsigned char d[REPO_DIGEST_LEN]);

#endif
