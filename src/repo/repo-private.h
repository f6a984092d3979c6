/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: the open repository, inside the library. */
#ifndef SNAPFG_REPO_PRIVATE_H
#define SNAPFG_REPO_PRIVATE_H

#include <pthread.h>

#include <jansson.h>

#include "repo-chunk.h"
#include "repo-store.h"

/* A thread's working memory for one chunk (repo.c): taken from the
 * repository's free list and given back, so that a run allocates (and
 * faults in) a chunk object's buffer and zstd's contexts once per
 * thread, not once per chunk.
 */
struct repo_scratch {
  struct repo_scratch *next;
  unsigned char *obj;           /* a whole chunk object (big_alloc) */
  size_t cap;
  struct ZSTD_CCtx_s *cctx;
  struct ZSTD_DCtx_s *dctx;
};

struct repo {
  pthread_mutex_t scratch_lock; /* protects scratch */
  struct repo_scratch *scratch; /* free ones */
  char *location;
  struct repo_store *store;
  json_t *config;
  bool encrypted;               /* the config says so */
  struct repo_keys keys;        /* keys.encrypted: the key was given */
  uint32_t chunk_size;
  char id[64];
};

struct repo_index {
  char *disk;
  long run;
  uint64_t disk_size;
  uint32_t chunk_size;
  uint64_t nchunks;
  unsigned char *digests;       /* REPO_DIGEST_LEN per chunk */
  json_t *meta;
};

#endif
