/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: the object store under a repository.
 *
 * A repository (docs/repository.md) is a set of named objects: chunks,
 * run indexes, the repository's config.  Two back ends keep them: a
 * local directory (repo-store-dir.c, written by the file rules of
 * design section 6 and synced before a put returns, or for a batch of
 * chunks by one sync) and an S3-compatible
 * object store (repo-store-s3.c, AWS Signature V4 through libcurl).
 * Everything above this interface is the same for both.
 *
 * Keys are relative paths of [A-Za-z0-9._-] components separated by '/'
 * ("chunks/ab/abcdef...", "index/DISK/0001.idx"); a back end refuses any
 * other key with -EINVAL.  Every function returns 0 or a negative errno
 * and, on failure, leaves a message in the thread's error record
 * (common/snapfg-error.h) that names the object and the store.
 */
#ifndef SNAPFG_REPO_STORE_H
#define SNAPFG_REPO_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct repo_store;

/* One object as list reports it. */
struct repo_object_info {
  const char *key;
  uint64_t size;
  int64_t mtime;                /* seconds since the epoch */
};

/* Called for each object under a prefix; non-zero stops the listing and
 * is returned by list.
 */
typedef int (*repo_list_fn) (void *opaque,
                             const struct repo_object_info *info);

struct repo_store_ops {
  const char *name;             /* "directory", "s3" */

  /* Store len bytes under key, durably (synced / acknowledged by the
   * object store) before it returns.  With if_absent, an existing object
   * is left as it is and -EEXIST is returned: the way two writers agree
   * on a new name (a run number) without a lock.
   */
  int (*put) (struct repo_store *s, const char *key,
              const void *buf, size_t len, bool if_absent);

  /* Optional (NULL: put): like put with if_absent, visible to every
   * other user of the store when it returns, but not made durable: for
   * an object that matters only while the process that put it runs (a
   * writer's registration), which a crash of the machine ends anyway.  A
   * crash may leave it missing, empty or whole, never under a wrong name.
   */
  int (*put_volatile) (struct repo_store *s, const char *key,
                       const void *buf, size_t len);

  /* The whole object, in a malloc'd buffer the caller frees; -ENOENT if
   * there is none.
   */
  int (*get) (struct repo_store *s, const char *key,
              void **buf, size_t *len);

  /* Its size and mtime; -ENOENT if there is none. */
  int (*head) (struct repo_store *s, const char *key,
               struct repo_object_info *info);

  /* Set its mtime to now (garbage collection's mark). */
  int (*touch) (struct repo_store *s, const char *key);

  /* Remove it; -ENOENT if there is none. */
  int (*del) (struct repo_store *s, const char *key);

  /* Every object whose key starts with prefix, in no particular order. */
  int (*list) (struct repo_store *s, const char *prefix,
               repo_list_fn fn, void *opaque);

  void (*close) (struct repo_store *s);

  /* Optional members (NULL in a back end whose put is durable when it
   * returns, as S3's is once acknowledged): a batch of puts made durable
   * by one sync instead of one each.
   *
   * put_unsynced: like put with if_absent (of the iovcnt pieces of iov
   * one after another: a chunk's header and its data, not copied into
   * one buffer first), but neither durable nor
   * visible under its name until the next sync: a reader, head or touch
   * does not see it before.  -EEXIST if the key exists already or is
   * pending in this batch.  A crash before the sync leaves no object
   * under the name (only partial files, which clean_partial removes).
   *
   * sync: every put_unsynced since the last sync made durable and given
   * its name (an object another writer stored meanwhile is kept: same
   * key, same content), durably.  0 or the first error.
   *
   * clean_partial: remove what puts that never finished (a crash) left,
   * if it is older than the time given (seconds since the epoch; a put
   * still going is younger), or at any age if it is already linked
   * under its name; *count is the number removed (or that would be,
   * with dry_run).
   */
  int (*put_unsynced) (struct repo_store *s, const char *key,
                       const struct iovec *iov, int iovcnt);
  int (*sync) (struct repo_store *s);
  int (*clean_partial) (struct repo_store *s, int64_t older_than,
                        bool dry_run, uint64_t *count);

  /* Optional: like get, into the caller's buffers (the pieces of iov
   * filled one after another, no allocation), *len the object's size;
   * -EFBIG if it is larger than they are (reported).
   */
  int (*get_iov) (struct repo_store *s, const char *key,
                  const struct iovec *iov, int iovcnt, size_t *len);
};

struct repo_store {
  const struct repo_store_ops *ops;
  char *location;               /* as the user wrote it, for messages */
};

/* Open the store at location: a directory path, or s3://BUCKET[/PREFIX]
 * (endpoint, region and credentials from struct repo_s3_options, which
 * the caller fills from options and the AWS environment variables).
 * With create, a directory that does not exist is made (mode 0700).
 */
struct repo_s3_options {
  const char *endpoint;         /* --s3-endpoint or AWS_ENDPOINT_URL */
  const char *region;           /* AWS_REGION, AWS_DEFAULT_REGION, or
                                 * "us-east-1" */
  const char *credentials_file; /* --s3-credentials (AWS shared
                                 * credentials format), or NULL */
  const char *profile;          /* AWS_PROFILE, or NULL for "default" */
};
extern int repo_store_open (const char *location,
                            const struct repo_s3_options *s3,
                            bool create, struct repo_store **s);
extern int repo_store_dir_open (const char *path, bool create,
                                struct repo_store **s);
extern int repo_store_s3_open (const char *url,
                               const struct repo_s3_options *s3,
                               struct repo_store **s);

/* Is location an S3 URL (s3://...)? */
extern bool repo_location_is_s3 (const char *location);

#endif
