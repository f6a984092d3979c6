/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: libcurl loaded on first use (repo-curl.h says why). */

#include <config.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "repo-curl.h"

struct repo_curl repo_curl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[512];

/* Each function, by the name libcurl exports it under. */
static const struct {
  const char *name;
  size_t offset;
} functions[] = {
#define F(member, symbol) { symbol, offsetof (struct repo_curl, member) }
  F (global_init, "curl_global_init"),
  F (easy_init, "curl_easy_init"),
  F (easy_cleanup, "curl_easy_cleanup"),
  F (easy_reset, "curl_easy_reset"),
  F (easy_setopt, "curl_easy_setopt"),
  F (easy_perform, "curl_easy_perform"),
  F (easy_getinfo, "curl_easy_getinfo"),
  F (easy_strerror, "curl_easy_strerror"),
  F (easy_escape, "curl_easy_escape"),
  F (free, "curl_free"),
  F (slist_append, "curl_slist_append"),
  F (slist_free_all, "curl_slist_free_all"),
#undef F
};

static void
load (void)
{
  /* Never closed: curl keeps global state for the process's life. */
  void *lib = dlopen (LIBCURL_SONAME, RTLD_NOW | RTLD_LOCAL);
  struct repo_curl c;

  if (lib == NULL) {
    snprintf (load_error, sizeof load_error, "cannot load libcurl (%s): %s",
              LIBCURL_SONAME, dlerror ());
    return;
  }
  for (size_t i = 0; i < sizeof functions / sizeof functions[0]; ++i) {
    void *f = dlsym (lib, functions[i].name);

    if (f == NULL) {
      snprintf (load_error, sizeof load_error, "%s: no function %s",
                LIBCURL_SONAME, functions[i].name);
      return;
    }
    memcpy ((char *) &c + functions[i].offset, &f, sizeof f);
  }
  repo_curl = c;
}

int
repo_curl_load (char *err, size_t err_len)
{
  pthread_once (&load_once, load);
  if (load_error[0]) {
    snprintf (err, err_len, "%s", load_error);
    return -1;
  }
  return 0;
}
