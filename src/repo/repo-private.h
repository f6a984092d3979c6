/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: the open repository, inside the library. */
#ifndef SNAPFG_REPO_PRIVATE_H
#define SNAPFG_REPO_PRIVATE_H

#include <jansson.h>

#include "repo-chunk.h"
#include "repo-store.h"

struct repo {
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
